"""The storage side of a testbed: Swift + the HAPI server, and the far end of rate probes.

:class:`StorageSide` does the work. With link shaping it runs in its own process and network
namespace (``python -m hapi_bench.agent_main``, started under ``unshare -n`` by
:class:`AgentProcess`), driven over stdin/stdout with one JSON object per line::

    -> {"cmd": "up", "config": {...StackConfig fields...}, "env": {"HAPI_ADAPTATION": "false"}}
    <- {"ok": true, "result": {"hapi_url": ..., "auth_url": ..., "pids": {...}}}

Without shaping the testbed calls a :class:`StorageSide` in its own process. Either way the stack
processes are spawned from a thread pinned to the server cores, so they inherit that mask.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from hapi_stack import RunningStack, StackConfig, down, up

from .errors import AgentError
from .shaping import ByteSource

__all__ = ["AgentProcess", "StackInfo", "StorageControl", "StorageSide", "main"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StackInfo:
    """Where a running stack answers, seen from the client, and the PIDs of its processes."""

    host: str
    hapi_url: str
    proxy_url: str
    auth_url: str
    pids: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, stack: RunningStack) -> StackInfo:
        return cls(
            host=stack.config.host,
            hapi_url=stack.hapi_url or "",
            proxy_url=stack.proxy_url,
            auth_url=stack.auth_url,
            pids=dict(stack.pids),
        )

    @property
    def server_pid(self) -> int | None:
        return self.pids.get("hapi-server")


@contextmanager
def _pinned(cores: tuple[int, ...] | None) -> Iterator[None]:
    # sched_setaffinity(0) is this thread only: children spawned meanwhile inherit the mask.
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class StorageControl:
    """What a testbed asks of its storage side (in-process or through the agent)."""

    def up(self, config: Mapping[str, Any], env: Mapping[str, str]) -> StackInfo:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def start_source(self, host: str, port: int) -> tuple[str, int]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class StorageSide(StorageControl):
    """Starts and stops the stack (always from the server cores) and rate-probe sources."""

    def __init__(self, server_cores: tuple[int, ...] | None = None) -> None:
        self.server_cores = server_cores
        self._config: StackConfig | None = None
        self._sources: list[ByteSource] = []

    def up(self, config: Mapping[str, Any], env: Mapping[str, str]) -> StackInfo:
        wanted = StackConfig.model_validate(dict(config))
        if self._config is not None:
            # hapi_stack refuses a second `up` with other settings: restart explicitly.
            down(self._config)
            self._config = None
        with _pinned(self.server_cores), _environment(env):
            stack = up(wanted)
        self._config = stack.config
        return StackInfo.of(stack)

    def down(self) -> None:
        if self._config is not None:
            down(self._config)
            self._config = None

    def start_source(self, host: str, port: int) -> tuple[str, int]:
        with _pinned(self.server_cores):
            source = ByteSource(host, port)
        self._sources.append(source)
        return source.address

    def close(self) -> None:
        for source in self._sources:
            source.close()
        self._sources.clear()
        self.down()


def _reply(out: IO[str], ok: bool, **body: Any) -> None:
    out.write(json.dumps({"ok": ok, **body}) + "\n")
    out.flush()


def serve(side: StorageSide, commands: IO[str], out: IO[str]) -> None:
    """Answer commands until ``exit`` or end of input; always stops the stack at the end."""
    try:
        for line in commands:
            if not line.strip():
                continue
            request = json.loads(line)
            cmd = request.get("cmd")
            try:
                if cmd == "up":
                    info = side.up(request.get("config", {}), request.get("env", {}))
                    _reply(out, True, result=asdict(info))
                elif cmd == "down":
                    side.down()
                    _reply(out, True)
                elif cmd == "source":
                    host, port = side.start_source(request["host"], int(request.get("port", 0)))
                    _reply(out, True, result={"host": host, "port": port})
                elif cmd == "exit":
                    _reply(out, True)
                    return
                else:
                    _reply(out, False, error=f"unknown command {cmd!r}")
            except Exception as exc:  # noqa: BLE001 - reported to the testbed, which raises
                log.exception("agent command %s failed", cmd)
                _reply(out, False, error=f"{type(exc).__name__}: {exc}")
    finally:
        side.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m hapi_bench.agent_main --cores 1``: run inside the storage namespace."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description="storage side of a shaped HAPI testbed"
    )
    parser.add_argument("--cores", default=None, help="comma-separated server cores")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="agent %(levelname)s %(name)s: %(message)s")
    cores = tuple(int(c) for c in args.cores.split(",")) if args.cores else None
    if cores is not None:
        os.sched_setaffinity(0, set(cores))
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # stdout carries the protocol only; anything else a library prints goes to stderr.
    out = sys.stdout
    sys.stdout = sys.stderr
    _reply(out, True, result={"pid": os.getpid()})
    serve(StorageSide(cores), sys.stdin, out)
    return 0


class AgentProcess(StorageControl):
    """The agent in a fresh network namespace (``unshare -n``), driven over its pipes."""

    def __init__(self, server_cores: tuple[int, ...], log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        command = [
            "unshare",
            "-n",
            "--",
            sys.executable,
            "-m",
            "hapi_bench.agent_main",
            "--cores",
            ",".join(map(str, server_cores)),
        ]
        # `unshare` execs the program after unsharing: the PID is the agent's own.
        self._proc = subprocess.Popen(  # noqa: S603
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        ready = self._read()
        self.pid = int(ready["pid"])

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise AgentError(f"the storage agent exited (status {code}); see {self._log.name}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise AgentError(f"storage agent: {answer.get('error')} (log: {self._log.name})")
        result: dict[str, Any] = answer.get("result") or {}
        return result

    def _call(self, cmd: str, **body: Any) -> dict[str, Any]:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps({"cmd": cmd, **body}) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError as exc:
            raise AgentError(f"the storage agent went away (log: {self._log.name})") from exc
        return self._read()

    def up(self, config: Mapping[str, Any], env: Mapping[str, str]) -> StackInfo:
        result = self._call("up", config=dict(config), env=dict(env))
        return StackInfo(**result)

    def down(self) -> None:
        self._call("down")

    def start_source(self, host: str, port: int) -> tuple[str, int]:
        result = self._call("source", host=host, port=port)
        return str(result["host"]), int(result["port"])

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._call("exit")
            except AgentError:
                pass
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.terminate()
                self._proc.wait(timeout=30)
        self._log.close()
