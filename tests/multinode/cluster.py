"""Simulated nodes for the tests: one network namespace per node, joined by a veth pair.

Each node has its own network namespace (``ip netns``), its own address on the link
(``10.77.0.1``, ``10.77.0.2``, ... on ``eth0``), its own loopback, its own host name (every
command runs in a UTS namespace of its own that carries it) and its own ``/etc/hosts``
(``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` mounts over ``/etc/hosts``). With
``debian_hosts`` (the default) a node's own name maps to 127.0.1.1 there, as in Debian's and
Ubuntu's usual file, and the other nodes' names to their link addresses: the setting under which
issue 22 saw workers handed an address only rank 0's node could reach.

::

    with SimulatedCluster.create(("node-a", "node-b")) as cluster:
        a, b = cluster.nodes
        cluster.run(b, ["getent", "hosts", "node-a"])             # 10.77.0.1 node-a
        proc = cluster.start(a, ["python", "-m", "http.server"], log_path=Path("a.log"))
        proc.stop()

Namespace names carry this process's PID, so concurrent test sessions on one machine never
collide; :meth:`SimulatedCluster.close` stops the processes it started (by process group) and
deletes exactly the namespaces and ``/etc/netns`` entries it made. The plumbing is
:mod:`hapi_bench.netns`, shared with the benchmarks' shaped link.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from hapi_bench import (
    NETNS_ETC,
    ShapingError,
    VethEnd,
    add_named_netns,
    add_veth_pair,
    delete_named_netns,
    netns_support,
)

__all__ = ["Node", "NodeProcess", "SimulatedCluster", "cluster_support"]

SUBNET = "10.77.0"
IFACE = "eth0"
_GRACE_S = 20.0
#: Sets the node's host name in its fresh UTS namespace, then becomes the command.
_AS_NODE = 'hostname "$0" && exec "$@"'


def cluster_support() -> str | None:
    """None when simulated nodes can be made here, else why not (the tests skip with it)."""
    return netns_support(("ip", "nsenter", "unshare", "hostname", "getent"))


@dataclass(frozen=True)
class Node:
    """One simulated machine."""

    hostname: str
    """Its host name, and its name in every node's hosts file."""
    netns: str
    """Its ``ip netns`` name."""
    address: str
    """Its address on the link (interface :data:`IFACE`)."""
    iface: str = IFACE

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` as run on this node: its namespace, its ``/etc/hosts``, its host name."""
        return [
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            _AS_NODE,
            self.hostname,
            *command,
        ]


class NodeProcess:
    """A process started on a node in a session of its own: it and its children stop together."""

    def __init__(self, node: Node, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.node = node
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        """Everything the process (and its children) wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait(self, timeout: float) -> int:
        """Its exit status; after ``timeout`` seconds it is stopped and TimeoutError raised."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise TimeoutError(
                f"{self.node.hostname}: {self.popen.args!r} did not finish within {timeout:.0f} s; "
                f"its output ends with:\n{self.output()[-4000:]}"
            ) from None

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after a grace period; a no-op once it is gone."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.popen.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                continue
        # Children that outlived the leader (torchrun's workers) share its group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)


def debian_hosts_file(node: Node, nodes: Sequence[Node]) -> str:
    """``/etc/hosts`` of ``node``: its own name on 127.0.1.1, the others on their link addresses."""
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{node.hostname}"]
    lines += [f"{other.address}\t{other.hostname}" for other in nodes if other != node]
    return "\n".join(lines) + "\n"


def plain_hosts_file(node: Node, nodes: Sequence[Node]) -> str:
    """``/etc/hosts`` naming every node, itself included, by its link address."""
    lines = ["127.0.0.1\tlocalhost", *(f"{n.address}\t{n.hostname}" for n in nodes)]
    return "\n".join(lines) + "\n"


class SimulatedCluster:
    """Nodes in network namespaces of their own; make one with :meth:`create`."""

    def __init__(self, nodes: Sequence[Node], *, made_etc: bool) -> None:
        self.nodes = tuple(nodes)
        self._made_etc = made_etc
        self._made: list[str] = []
        self._processes: list[NodeProcess] = []

    @classmethod
    def create(
        cls,
        hostnames: Sequence[str] = ("node-a", "node-b"),
        *,
        debian_hosts: bool = True,
        tag: str | None = None,
    ) -> SimulatedCluster:
        """Two nodes joined by a veth pair, named ``hostnames``, at 10.77.0.1 and 10.77.0.2.

        ``tag`` makes the namespace names unique (default: this process's PID).
        """
        if len(hostnames) != 2:
            raise ValueError("a veth pair joins exactly two nodes")
        tag = tag or str(os.getpid())
        nodes = [
            Node(name, f"hapi-{tag}-{name}", f"{SUBNET}.{i + 1}")
            for i, name in enumerate(hostnames)
        ]
        cluster = cls(nodes, made_etc=not NETNS_ETC.exists())
        hosts = debian_hosts_file if debian_hosts else plain_hosts_file
        try:
            for node in nodes:
                add_named_netns(node.netns, files={"hosts": hosts(node, nodes)})
                cluster._made.append(node.netns)
            left, right = nodes
            add_veth_pair(
                VethEnd(left.iface, left.address, left.netns),
                VethEnd(right.iface, right.address, right.netns),
            )
        except BaseException:
            cluster.close()
            raise
        return cluster

    def __enter__(self) -> SimulatedCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def node(self, hostname: str) -> Node:
        for node in self.nodes:
            if node.hostname == hostname:
                return node
        raise KeyError(hostname)

    def run(
        self,
        node: Node,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``node`` to the end; with ``check``, a failure raises with its output."""
        done = subprocess.run(  # noqa: S603
            node.argv(command),
            env=self._env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} failed on {node.hostname} (status {done.returncode}): "
                f"{done.stdout}{done.stderr}"
            )
        return done

    def start(
        self,
        node: Node,
        command: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> NodeProcess:
        """Start ``command`` on ``node`` (stdout and stderr to ``log_path``); :meth:`close` stops it."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as out:
            popen = subprocess.Popen(  # noqa: S603
                node.argv(command),
                env=self._env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = NodeProcess(node, popen, log_path)
        self._processes.append(proc)
        return proc

    def resolve(self, node: Node, name: str) -> list[str]:
        """The IPv4 addresses ``name`` resolves to on ``node`` (its own hosts file)."""
        done = self.run(node, ["getent", "ahostsv4", name], check=False)
        return list(dict.fromkeys(line.split()[0] for line in done.stdout.splitlines() if line))

    @staticmethod
    def _env(env: Mapping[str, str] | None) -> dict[str, str]:
        return {**os.environ, **(env or {})}

    def close(self) -> None:
        """Stop what :meth:`start` started, then delete the namespaces and files made."""
        for proc in self._processes:
            proc.stop()
        self._processes.clear()
        errors: list[BaseException] = []
        for name in reversed(self._made):
            try:
                delete_named_netns(name)
            except ShapingError as exc:
                errors.append(exc)
        self._made.clear()
        if self._made_etc:
            with contextlib.suppress(OSError):  # another session's namespace may still use it
                NETNS_ETC.rmdir()
        if errors:
            raise errors[0]
