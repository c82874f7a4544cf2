"""A testbed: Swift + the HAPI server on the server cores, a client on the client cores, a link.

Two kinds, one API (:class:`Testbed`):

* **netns** (when :func:`hapi_bench.shaping.shaping_support` finds no obstacle): the job runs in
  a process in a fresh network namespace (``python -m hapi_bench.job_main``, started by
  :func:`run_job` under ``unshare -n``); the storage side runs in a second namespace (the
  agent); a veth pair shaped with htb joins them.
* **throttle**: everything in this process's namespace on free loopback ports; the client's
  transfers go through a token bucket.

A job is a function ``job(testbed, **kwargs) -> int`` named ``"module:function"``, so that the
same code runs in either kind and the namespaced process can import it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from swiftclient.client import Connection

from hapi_client import HapiClient, SwiftCredentials
from hapi_stack import ADMIN_USER, StackConfig

from .agent import AgentProcess, StackInfo, StorageControl, StorageSide
from .errors import BenchError, ScenarioError
from .machine import CoreSplit, pin_process, split_cores
from .shaping import (
    STORAGE_ADDR,
    Link,
    LinkCheck,
    NetnsLink,
    ThrottleLink,
    measure_rate,
    shaping_support,
)

__all__ = [
    "Job",
    "Testbed",
    "host_testbed",
    "isolated_main",
    "link_check_job",
    "netns_testbed",
    "run_job",
]

log = logging.getLogger(__name__)

Job = Callable[..., int]


class Testbed:
    """The stack, the link and the cores of one benchmark or demo run.

    Start the stack with :meth:`start_stack`, make clients with :meth:`client` (they go through
    the link), change the rate with :meth:`set_rate` and check it with :meth:`measure_link`.
    """

    def __init__(
        self,
        storage: StorageControl,
        link: Link,
        cores: CoreSplit,
        host: str,
        state_dir: Path,
        *,
        free_ports: bool,
    ) -> None:
        self.storage = storage
        self.link = link
        self.cores = cores
        self.host = host
        self.state_dir = state_dir
        self._free_ports = free_ports
        self._stack: StackInfo | None = None
        self._source: tuple[str, int] | None = None
        self._rate_lock = threading.Lock()
        self.stack_config: dict[str, Any] = {}

    @property
    def kind(self) -> str:
        """``netns`` or ``throttle``."""
        return self.link.kind

    @property
    def stack(self) -> StackInfo:
        if self._stack is None:
            raise BenchError("the testbed's stack is not running: call start_stack() first")
        return self._stack

    def start_stack(
        self,
        settings: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
        **config: Any,
    ) -> StackInfo:
        """(Re)start Swift + the HAPI server; ``settings`` are HAPI server settings (``HAPI_*``).

        ``config`` are :class:`hapi_stack.StackConfig` fields (e.g. ``proxy_extra_filters``);
        ``env`` is extra environment of the stack's processes.
        """
        fields: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "host": self.host,
            "hapi_server": True,
        }
        if self._free_ports:
            free = StackConfig.on_free_ports(host=self.host)
            fields.update({k: getattr(free, k) for k in free.active_port_settings()})
            fields["hapi_port"] = free.hapi_port
        fields.update(config)
        # One extraction per server core at a time unless a scenario says otherwise: on a CPU,
        # concurrent requests only interleave on the same cores, which delays every request's
        # first bytes (and the client's pipeline) without adding throughput.
        # No feature store unless a scenario asks (sweep does): the thesis' scenarios time each
        # epoch's extraction, which a store would answer from its first epoch's features.
        defaults = {
            "torch_threads": len(self.cores.server),
            "max_concurrent_per_device": len(self.cores.server),
            "feature_store_bytes": 0,
        }
        merged = {**defaults, **(settings or {})}
        server_env = {f"HAPI_{k.upper()}": str(v) for k, v in merged.items()}
        server_env.update(env or {})
        self._stack = self.storage.up(fields, server_env)
        self.stack_config = {"settings": merged, "env": dict(env or {}), **config}
        log.info("stack up: HAPI %s, Swift %s", self._stack.hapi_url, self._stack.proxy_url)
        return self._stack

    def stop_stack(self) -> None:
        if self._stack is not None:
            self.storage.down()
            self._stack = None

    def credentials(self) -> SwiftCredentials:
        return SwiftCredentials(self.stack.auth_url, ADMIN_USER.name, ADMIN_USER.key)

    def connection(self) -> Connection:
        """An admin swiftclient connection (uploads): it crosses the link like any client."""
        creds = self.credentials()
        return Connection(
            authurl=creds.auth_url,
            user=creds.user,
            key=creds.key,
            auth_version="1",
            retries=2,
            timeout=120,
        )

    def client(self, **options: Any) -> HapiClient:
        """A HAPI client of the stack's server whose transfers cross the link."""
        client = HapiClient(self.stack.hapi_url, self.credentials(), **options)
        self.link.attach(client)
        return client

    def set_rate(self, mbit: float | None) -> None:
        """Limit the link to ``mbit`` Mbit/s each way (None: unshaped); safe from any thread."""
        with self._rate_lock:
            self.link.set_rate(mbit)

    def measure_link(self, seconds: float = 1.0) -> LinkCheck:
        """Measure the storage-to-client rate with a short TCP transfer at the current setting."""
        if self._source is None:
            if self.kind == "netns":
                self._source = self.storage.start_source(STORAGE_ADDR, 0)
            else:
                self._source = self.storage.start_source("127.0.0.1", 0)
        consume = None
        if isinstance(self.link, ThrottleLink):
            consume = self.link.bucket.consume
        nbytes, elapsed = measure_rate(self._source, seconds=seconds, consume=consume)
        check = LinkCheck(
            kind=self.kind,
            method=self.link.method,
            target_mbit=self.link.rate_mbit,
            measured_mbit=nbytes * 8 / elapsed / 1e6,
            nbytes=nbytes,
            seconds=elapsed,
        )
        (log.warning if check.flagged else log.info)("link: %s", check.describe())
        return check

    def describe(self) -> dict[str, Any]:
        return {
            "link": self.kind,
            "link_method": self.link.method,
            "cores": {"client": list(self.cores.client), "server": list(self.cores.server)},
            "cores_note": self.cores.describe(),
            "server_settings": {
                k: str(v) for k, v in self.stack_config.get("settings", {}).items()
            },
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        }

    def close(self) -> None:
        self.storage.close()


@contextmanager
def host_testbed(state_dir: Path, cores: CoreSplit | None = None) -> Iterator[Testbed]:
    """A throttle testbed in this process (loopback, free ports); pins this process to the client cores."""
    cores = cores or split_cores()
    before = os.sched_getaffinity(0)
    pin_process(cores.client)
    testbed = Testbed(
        StorageSide(cores.server), ThrottleLink(), cores, "127.0.0.1", state_dir, free_ports=True
    )
    try:
        yield testbed
    finally:
        testbed.close()
        pin_process(tuple(before))


@contextmanager
def netns_testbed(state_dir: Path, cores: CoreSplit | None = None) -> Iterator[Testbed]:
    """A netns testbed; this process must already be in its own network namespace."""
    cores = cores or split_cores()
    pin_process(cores.client)
    agent = AgentProcess(cores.server, state_dir / "logs" / "bench-agent.log")
    try:
        link = NetnsLink.create(agent.pid)
        testbed = Testbed(agent, link, cores, STORAGE_ADDR, state_dir, free_ports=False)
        yield testbed
    finally:
        agent.close()


def link_check_job(
    testbed: Testbed, rates: list[float | None], out: str, seconds: float = 1.0
) -> int:
    """A job that only measures the link at each rate and writes the checks to ``out`` (JSON)."""
    checks = []
    for rate in rates:
        testbed.set_rate(rate)
        checks.append(testbed.measure_link(seconds).as_dict())
    Path(out).write_text(json.dumps({"testbed": testbed.describe(), "checks": checks}, indent=2))
    return 0


def _resolve(entry: str) -> Job:
    module, _, name = entry.partition(":")
    job = getattr(importlib.import_module(module), name, None)
    if not callable(job):
        raise ScenarioError(f"{entry!r} is not a job function")
    return job  # type: ignore[no-any-return]


def _torch_threads(cores: CoreSplit) -> None:
    import torch

    torch.set_num_threads(len(cores.client))


def run_job(
    entry: str,
    kwargs: Mapping[str, Any],
    state_dir: Path,
    *,
    shaping: bool | None = None,
    nice: int = 0,
) -> int:
    """Run ``entry(testbed, **kwargs)`` on a netns testbed if possible, else a throttle one.

    ``shaping``: True insists on tc shaping (ScenarioError when unavailable), False forces the
    throttle, None picks the best available. ``nice`` is added to the niceness of the job, the
    agent and the stack (negative needs root: it keeps other work on a shared machine from
    disturbing the measurements). The netns run is a child process; its output goes to this
    process's stdout and stderr.
    """
    job = _resolve(entry)  # fail early on a bad name, before starting anything
    reason = shaping_support() if shaping is not False else "throttle asked for"
    if reason is not None:
        if shaping:
            raise ScenarioError(f"tc shaping is not available here: {reason}")
        log.warning(
            "link shaping with tc is not available (%s): using the client-side token bucket", reason
        )
        state_dir.mkdir(parents=True, exist_ok=True)
        if nice:
            os.nice(nice)  # this thread, and every process and thread started from it
        with host_testbed(state_dir.resolve()) as testbed:
            _torch_threads(testbed.cores)
            return int(job(testbed, **kwargs))
    state_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, dir=state_dir) as handle:
        json.dump(
            {"entry": entry, "kwargs": dict(kwargs), "state_dir": str(state_dir.resolve())}, handle
        )
        spec = Path(handle.name)
    try:
        command = ["unshare", "-n", "--", sys.executable, "-m", "hapi_bench.job_main", str(spec)]
        if nice:
            command = ["nice", "-n", str(nice), *command]
        done = subprocess.run(command, check=False)  # noqa: S603
    finally:
        spec.unlink(missing_ok=True)
    return done.returncode


def isolated_main(argv: list[str]) -> int:
    """Entry of the namespaced job process: ``python -m hapi_bench.job_main SPEC.json``."""
    spec = json.loads(Path(argv[0]).read_text())
    level = os.environ.get("HAPI_BENCH_LOG", "WARNING")
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    job = _resolve(spec["entry"])
    with netns_testbed(Path(spec["state_dir"])) as testbed:
        _torch_threads(testbed.cores)
        return int(job(testbed, **spec["kwargs"]))
