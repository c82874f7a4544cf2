"""A job of 4 workers loses its node mid-epoch and is started again on 3 (issue 22: "a shrink
from 4 workers to 3 with each sample once"), under real torchrun (``--standalone``).

The first start runs ``--nproc-per-node 4`` with a checkpoint every 2 rounds; once a checkpoint
of the second epoch is written, torchrun's agent and its 4 workers are killed with SIGKILL (the
node is gone). The same job is then launched again with 3 workers on the same checkpoint
directory (:func:`~hapi_client.distributed.launch`: ``--nproc-per-node 3``) and finishes: the
epoch's remaining samples are dealt again over 3 ranks. Exactly-once is read from outside the
trainers, from the workers' sample logs (:func:`~hapi_client.distributed.delivered`). The rule
is the median with f = 1, which holds on 4 workers and on 3 (n >= 2f+1). Before that resume, the
same job with ``q = 3`` (one reply not waited for: n - q = 1 is kept, so q = 2 on 3 workers) is
refused by ``launch`` with an error naming both worlds, and leaves the checkpoint as it was.

EfficientNet-Lite0, 64 px, split = freeze = 21; the session's 40 test photos (4 shards of 10), a
global batch of 8 (5 rounds per epoch), 2 epochs: the kill lands in the second, whose rest is
the resize under test (a third epoch on 3 workers would only repeat it). Rank 1 sleeps 0.2 s per
sample, so a round lasts about 0.4 s and the kill lands mid-epoch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from hapi_client import ExtractOptions, TrainOptions
from hapi_client.distributed import (
    DistributedConfig,
    DistributedConfigError,
    delivered,
    launch,
    read_sample_log,
    torchrun_command,
)
from tests.hapi_client.conftest import ClientEnv
from tests.hapi_client.distributed.torchrun_jobs import checkpoint_round, torchrun_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.swift]

FIRST, THEN = 4, 3
SAMPLES, SHARD, BATCH, EPOCHS = 40, 10, 8, 2
ROUNDS_PER_EPOCH = SAMPLES // BATCH
EVERY_SAMPLE = sorted((s, i) for s in range(SAMPLES // SHARD) for i in range(SHARD))
#: A checkpoint every 2 rounds: the first one at or after this is round 8, 3 rounds into epoch 2.
KILL_AFTER = ROUNDS_PER_EPOCH + 2


def _config(client_env: ClientEnv, work: Path) -> DistributedConfig:
    return DistributedConfig(
        model=client_env.models["efficientnet_lite0"].name,
        container=client_env.test,  # 40 photos in shards of 10
        endpoint=client_env.server.url,
        train=TrainOptions(batch_size=BATCH, epochs=EPOCHS, lr=0.01, seed=0),
        extract=ExtractOptions(split=21, freeze_index=21, image_size=64),
        aggregator="median",
        f=1,
        straggler_rank=1,
        straggler_delay_s=0.2,
        checkpoint_dir=str(work / "ckpt"),
        checkpoint_every=2,
        sample_log_dir=str(work / "samples"),
        results_path=str(work / "results.json"),
        gather_timeout_s=60,
        channel_timeout_s=60,
    )


def _starts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's start line, oldest start first."""
    return sorted(
        (r for r in records if r["event"] == "start"), key=lambda r: (r["attempt"], r["rank"])
    )


def _lose_the_node(client_env: ClientEnv, config: DistributedConfig, work: Path) -> int:
    """Run ``config`` on 4 workers; once a checkpoint of round KILL_AFTER or later is written,
    SIGKILL torchrun's agent and every worker. Returns the round of the checkpoint left."""
    config_path = work / "config-4.json"
    config_path.write_text(config.to_json())
    cmd = torchrun_command(FIRST, [config_path], log_level="info")
    samples = Path(str(config.sample_log_dir))
    ckpt = Path(str(config.checkpoint_dir))
    with (work / "torchrun-4.log").open("wb") as out:
        proc = subprocess.Popen(  # noqa: S603
            cmd,
            env=torchrun_env(client_env.credentials),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            # The workers' pids first, so that the kill follows the checkpoint at once.
            starts = wait_for(
                f"{FIRST} workers' start lines",
                lambda: (s := _starts(read_sample_log(samples))) and len(s) == FIRST and s,
                proc,
            )
            wait_for(
                f"a checkpoint of round {KILL_AFTER}",
                lambda: checkpoint_round(ckpt) >= KILL_AFTER,
                proc,
            )
            # torchrun starts each worker in a session of its own: the agent's group is not theirs.
            os.killpg(proc.pid, signal.SIGKILL)
            for start in starts:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(start["pid"], signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return checkpoint_round(ckpt)


def test_a_job_of_4_workers_resumes_on_3_after_a_node_loss_every_sample_once(
    client_env: ClientEnv, tmp_path: Path
) -> None:
    began = time.monotonic()
    config = _config(client_env, tmp_path)
    saved = _lose_the_node(client_env, config, tmp_path)
    killed = time.monotonic()
    assert ROUNDS_PER_EPOCH < saved < 2 * ROUNDS_PER_EPOCH, "the kill must land mid-epoch 2"

    # The same rule waiting for q = 3 of 4 held on 4 workers; on 3 it would wait for 2 (n - q
    # is kept), below the median's 2f+1 = 3: refused before torchrun starts, checkpoint intact.
    waiting_for_3 = config.replace(q=3)
    waiting_for_3.check_world(FIRST)
    with pytest.raises(
        DistributedConfigError,
        match=r"the job started with 4 workers and now has 3: aggregator 'median' with n=q=2, "
        r"f=1: .*requires n >= 2f\+1",
    ):
        launch(THEN, waiting_for_3, credentials=client_env.credentials)
    assert checkpoint_round(Path(str(config.checkpoint_dir))) == saved

    result = launch(
        THEN, config, credentials=client_env.credentials, log_path=tmp_path / "torchrun-3.log"
    )
    elapsed = time.monotonic() - began

    records = read_sample_log(tmp_path / "samples")
    first, second = sorted({r["attempt"] for r in records})
    starts = _starts(records)
    assert [(r["rank"], r["world"]) for r in starts if r["attempt"] == first] == [
        (rank, FIRST) for rank in range(FIRST)
    ]
    assert [
        (r["rank"], r["world"], r["resumed_round"]) for r in starts if r["attempt"] == second
    ] == [(rank, THEN, saved) for rank in range(THEN)]
    # Each epoch's samples exactly once across both starts: the first start's rounds up to the
    # checkpoint, the second's from there (the rounds trained after the checkpoint, before the
    # kill, were trained again on 3 ranks and count once).
    by_epoch = delivered(records)
    assert sorted(by_epoch) == list(range(EPOCHS))
    for epoch, samples in by_epoch.items():
        assert sorted(samples) == EVERY_SAMPLE, f"epoch {epoch + 1}"
    # The rest of epoch 2 was dealt over the 3 ranks left.
    for epoch in range(1, EPOCHS):
        ranks = {
            r["rank"]
            for r in records
            if r["event"] == "round" and r["attempt"] == second and r["epoch"] == epoch
        }
        assert ranks == set(range(THEN)), f"epoch {epoch + 1}"
    assert (result.world_size, result.q, result.f) == (THEN, THEN, 1)
    assert result.resumed_round == saved
    assert [m.samples for m in result.history] == [SAMPLES] * EPOCHS
    print(
        f"\n{FIRST} workers killed after the checkpoint of round {saved} (epoch 2); "
        f"resumed and finished on {THEN}: {killed - began:.0f} s until the kill, "
        f"{elapsed - (killed - began):.0f} s to refuse q=3 and finish on {THEN}, {elapsed:.0f} s in all"
    )
