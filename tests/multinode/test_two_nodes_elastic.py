"""Two nodes that lose one: restarted, the job resumes from its checkpoint; gone for good, the
job finishes on fewer ranks (issue 22.2 and 22.3).

Both jobs run ``python -m hapi_client.distributed`` on 2 nodes x 2 processes under real
torchrun (c10d rendezvous on node-a, ``--max-restarts 1``,
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) with a checkpoint every round in a directory both
nodes see. Node-b's agent and workers are killed with SIGKILL (a node lost) a few rounds into
the second epoch. Exactly-once is read from outside the trainers: every rank logs the samples
it was dealt each round (``sample_log_dir``), and :func:`~hapi_client.distributed.delivered`
keeps each start's rounds up to where the next one resumed.

EfficientNet-Lite0, 64 px, 40 photos in 8 shards of 5, a global batch of 8 (5 rounds per epoch),
3 epochs; rank 1 sleeps 0.15 s per sample so that a round lasts about 0.3 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hapi_client import ExtractOptions, TrainOptions
from hapi_client.distributed import (
    DistributedConfig,
    DistributedResult,
    delivered,
    read_sample_log,
)
from tests.hapi_client.distributed.torchrun_jobs import checkpoint_round

from .cluster import NodeProcess, SimulatedCluster
from .conftest import MODEL, SHARD_SIZE, TRAIN, TRAIN_SAMPLES
from .stack import NodeStack
from .torchrun import start_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.swift]

EPOCHS, BATCH = 3, 8
ROUNDS_PER_EPOCH = TRAIN_SAMPLES // BATCH
EVERY_SAMPLE = sorted((s, i) for s in range(TRAIN_SAMPLES // SHARD_SIZE) for i in range(SHARD_SIZE))
KILL_AFTER = ROUNDS_PER_EPOCH + 2
#: After a loss, a rendezvous waits 5 s for more nodes once MIN are there, and counts a node
#: dead after 3 missed 1 s heartbeats (torch's defaults: 30 s, and 3 missed 5 s ones).
RDZV_CONF = "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=3"


def _config(node_stack: NodeStack, work: Path) -> Path:
    config = DistributedConfig(
        model=MODEL,
        container=TRAIN,
        endpoint=node_stack.hapi_url,
        train=TrainOptions(batch_size=BATCH, epochs=EPOCHS, lr=0.01, seed=0),
        extract=ExtractOptions(split=21, freeze_index=21, image_size=64),
        straggler_rank=1,
        straggler_delay_s=0.15,
        checkpoint_dir=str(work / "ckpt"),
        checkpoint_every=1,
        sample_log_dir=str(work / "samples"),
        results_path=str(work / "results.json"),
        gather_timeout_s=60,
        channel_timeout_s=60,
    )
    path = work / "config.json"
    path.write_text(config.to_json())
    return path


def _wait_for(what: str, check: Callable[[], Any], procs: list[NodeProcess]) -> Any:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        ended = [p for p in procs if p.popen.poll() is not None]
        if ended:
            pytest.fail(
                f"{ended[0].node.hostname}'s torchrun ended while waiting for {what}:\n"
                f"{ended[0].output()[-3000:]}"
            )
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _start(
    cluster: SimulatedCluster, node_stack: NodeStack, work: Path, config: Path, nnodes: str
) -> list[NodeProcess]:
    env = {**node_stack.swift_env(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    return [
        _start_node(cluster, node, work, config, nnodes, env, f"{node.hostname}.log")
        for node in cluster.nodes
    ]


def _start_node(
    cluster: SimulatedCluster,
    node: Any,
    work: Path,
    config: Path,
    nnodes: str,
    env: dict[str, str],
    log_name: str,
) -> NodeProcess:
    return start_torchrun(
        cluster,
        node,
        ["-m", "hapi_client.distributed", str(config), "--log-level", "info"],
        log_path=work / log_name,
        nproc_per_node=2,
        rdzv_id=f"elastic-{work.name}",
        nnodes=nnodes,
        env=env,
        extra=["--max-restarts", "1", "--rdzv-conf", RDZV_CONF],
    )


def _kill_node(proc: NodeProcess, samples: Path) -> float:
    """SIGKILL to the node's agent and to its workers (torchrun starts each in a session of its
    own, so the agent's group does not hold them): the node is gone."""
    records = read_sample_log(samples)
    latest = max(r["attempt"] for r in records if r["event"] == "start")
    workers = [
        r["pid"]
        for r in records
        if r["event"] == "start" and r["attempt"] == latest and r["host"] == proc.node.hostname
    ]
    assert len(workers) == 2, records
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.popen.wait()
    return time.time()


def _starts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One start line per start of the job (rank 0's), in order."""
    return sorted(
        (r for r in records if r["event"] == "start" and r["rank"] == 0),
        key=lambda r: r["attempt"],
    )


def _check_exactly_once(records: list[dict[str, Any]]) -> None:
    by_epoch = delivered(records)
    assert sorted(by_epoch) == list(range(EPOCHS))
    for epoch, samples in by_epoch.items():
        assert sorted(samples) == EVERY_SAMPLE, f"epoch {epoch + 1}"


def _result(work: Path) -> DistributedResult:
    return DistributedResult.from_dict(json.loads((work / "results.json").read_text()))


def _again_after(records: list[dict[str, Any]], attempt: int) -> float:
    return min(r["t"] for r in records if r["event"] == "round" and r["attempt"] == attempt)


def test_a_node_killed_mid_epoch_and_restarted_resumes_from_the_checkpoint(
    cluster: SimulatedCluster, node_stack: NodeStack, tmp_path: Path
) -> None:
    config = _config(node_stack, tmp_path)
    procs = _start(cluster, node_stack, tmp_path, config, "2")
    node_a, node_b = procs
    try:
        samples = tmp_path / "samples"
        _wait_for(
            f"a checkpoint of round {KILL_AFTER}",
            lambda: checkpoint_round(tmp_path / "ckpt") >= KILL_AFTER,
            procs,
        )
        killed_at = _kill_node(node_b, samples)
        env = {**node_stack.swift_env(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        back = _start_node(cluster, node_b.node, tmp_path, config, "2", env, "node-b-again.log")
        for proc in (node_a, back):
            assert proc.wait(300) == 0, proc.output()[-4000:]
    finally:
        for proc in (*procs,):
            proc.stop()
    records = read_sample_log(tmp_path / "samples")
    first, second = _starts(records)[:2]
    assert first["world"] == second["world"] == 4
    assert ROUNDS_PER_EPOCH < second["resumed_round"] < EPOCHS * ROUNDS_PER_EPOCH
    _check_exactly_once(records)
    result = _result(tmp_path)
    assert result.world_size == 4 and result.resumed_round == second["resumed_round"]
    assert [m.samples for m in result.history] == [TRAIN_SAMPLES] * EPOCHS
    print(
        f"\nnode-b killed after round {second['resumed_round']}+ and restarted: training again "
        f"{_again_after(records, second['attempt']) - killed_at:.1f} s after the kill"
    )


def test_a_node_gone_for_good_the_job_finishes_on_fewer_ranks(
    cluster: SimulatedCluster, node_stack: NodeStack, tmp_path: Path
) -> None:
    config = _config(node_stack, tmp_path)
    procs = _start(cluster, node_stack, tmp_path, config, "1:2")
    node_a, node_b = procs
    try:
        samples = tmp_path / "samples"
        _wait_for(
            f"a checkpoint of round {KILL_AFTER}",
            lambda: checkpoint_round(tmp_path / "ckpt") >= KILL_AFTER,
            procs,
        )
        killed_at = _kill_node(node_b, samples)
        assert node_a.wait(300) == 0, node_a.output()[-4000:]
    finally:
        for proc in procs:
            proc.stop()
    records = read_sample_log(tmp_path / "samples")
    first, second = _starts(records)[:2]
    assert (first["world"], second["world"]) == (4, 2)
    assert ROUNDS_PER_EPOCH < second["resumed_round"] < EPOCHS * ROUNDS_PER_EPOCH
    _check_exactly_once(records)
    # The epoch in progress was finished by the two ranks left, dealt its remaining samples.
    resumed_epoch = (second["resumed_round"]) // ROUNDS_PER_EPOCH
    ranks_after = {
        r["rank"]
        for r in records
        if r["event"] == "round"
        and r["attempt"] == second["attempt"]
        and r["epoch"] == resumed_epoch
    }
    assert ranks_after == {0, 1}
    result = _result(tmp_path)
    assert result.world_size == 2 and result.q == 2
    assert [m.samples for m in result.history] == [TRAIN_SAMPLES] * EPOCHS
    print(
        f"\nnode-b gone after round {second['resumed_round']}+: training again on 2 ranks "
        f"{_again_after(records, second['attempt']) - killed_at:.1f} s after the kill"
    )
