"""torchrun on simulated nodes: one agent per node, c10d rendezvous on the first node.

:func:`torchrun_argv` is the command line of one node; :func:`start_torchrun` starts it on a node
(a :class:`~tests.multinode.cluster.NodeProcess` to kill or wait for, as a restart test needs);
:func:`run_torchrun` runs a job on every node to the end and returns what each node wrote.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .cluster import IFACE, Node, NodeProcess, SimulatedCluster

__all__ = [
    "RDZV_PORT",
    "NodeRun",
    "node_env",
    "run_torchrun",
    "start_torchrun",
    "torchrun_argv",
]

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
RDZV_PORT = 29400


def torchrun_argv(
    target: Sequence[str],
    *,
    nnodes: str,
    nproc_per_node: int,
    rdzv_host: str,
    rdzv_id: str,
    rdzv_port: int = RDZV_PORT,
    extra: Sequence[str] = (),
) -> list[str]:
    """``torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d ... TARGET``.

    ``target`` is a script and its arguments, or ``["-m", "module", ...]``; ``nnodes`` may be an
    elastic range (``"1:2"``); ``extra`` goes before the target (``--max-restarts 1``, ...).
    """
    return [
        TORCHRUN,
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(nproc_per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{rdzv_host}:{rdzv_port}",
        "--rdzv-id",
        rdzv_id,
        *extra,
        *target,
    ]


def node_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every torchrun of the tests adds to the environment (``env`` wins).

    ``GLOO_SOCKET_IFNAME``: gloo picks its interface from the host name, which the Debian hosts
    file maps to 127.0.1.1, out of the other node's reach (docs/robust.md says the same to users).
    One thread per process: the machine has few cores and the jobs are small.
    """
    return {"GLOO_SOCKET_IFNAME": IFACE, "OMP_NUM_THREADS": "1", **(env or {})}


def start_torchrun(
    cluster: SimulatedCluster,
    node: Node,
    target: Sequence[str],
    *,
    log_path: Path,
    nproc_per_node: int,
    rdzv_id: str,
    nnodes: str | None = None,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> NodeProcess:
    """Start this node's torchrun agent; the rendezvous is on the cluster's first node.

    The endpoint names that node by its host name, as a user would: torchrun decides whether
    it hosts the rendezvous store by matching the endpoint against its host name and what that
    resolves to, and under the Debian hosts file the node's link address matches neither.
    """
    argv = torchrun_argv(
        target,
        nnodes=nnodes or str(len(cluster.nodes)),
        nproc_per_node=nproc_per_node,
        rdzv_host=cluster.nodes[0].hostname,
        rdzv_id=rdzv_id,
        extra=extra,
    )
    return cluster.start(node, argv, log_path=log_path, env=node_env(env))


@dataclass(frozen=True)
class NodeRun:
    """How one node's torchrun ended."""

    node: Node
    returncode: int
    output: str
    seconds: float


def run_torchrun(
    cluster: SimulatedCluster,
    target: Sequence[str],
    *,
    log_dir: Path,
    nproc_per_node: int,
    rdzv_id: str,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> list[NodeRun]:
    """Run ``target`` under torchrun on every node at once and wait for all of them.

    Returns each node's exit status and output (``log_dir/<hostname>.log``), in node order. A
    node still running ``timeout`` seconds after the start is stopped with the others, and
    TimeoutError carries every node's output.
    """
    start = time.monotonic()
    procs = [
        start_torchrun(
            cluster,
            node,
            target,
            log_path=log_dir / f"{node.hostname}.log",
            nproc_per_node=nproc_per_node,
            rdzv_id=rdzv_id,
            env=env,
            extra=extra,
        )
        for node in cluster.nodes
    ]
    runs = []
    try:
        for proc in procs:
            code = proc.wait(max(1.0, timeout - (time.monotonic() - start)))
            runs.append(NodeRun(proc.node, code, proc.output(), time.monotonic() - start))
    except TimeoutError:
        for proc in procs:
            proc.stop()
        outputs = "\n".join(f"--- {p.node.hostname}:\n{p.output()[-3000:]}" for p in procs)
        raise TimeoutError(f"torchrun did not finish within {timeout:.0f} s\n{outputs}") from None
    return runs
