"""A worker killed mid-epoch under real torchrun (``--standalone --max-restarts 1``): the job
resumes from its last checkpoint, each sample is delivered exactly once per epoch (read from the
workers' sample logs, from outside), and the final weights equal an uninterrupted run's. The
killed job keeps its features in the disk feature cache, so the restarted workers fetch nothing
again. A restart that fetches them again (the memory cache dies with the workers) is killed and
resumed in ``tests/multinode/test_two_nodes_elastic.py`` (every sample once) and, to the same
weights, in ``tests/hapi_client/test_finetune_checkpoint.py``: a second job here cost 40 s.

Setup: EfficientNet-Lite0 (ImageNet weights), 64 px, split = freeze = 21 (the server runs the
backbone, the workers train the classifier on 1280 floats per sample); 480 Fashion-MNIST
images in 12 shards of 40, 3 workers, a global batch of 48 (10 rounds per epoch), 2 epochs
(the kill lands in the second: the disk cache holds every shard by then), a checkpoint every 2
rounds. Rank 2 sleeps 20 ms per sample (a simulated slow device), so a round lasts about 0.3 s
and the kill lands mid-epoch.

Each torchrun start costs every worker its torch import and model set-up (about 17 s of CPU on
two cores), so the tests that only resume a finished checkpoint, or are refused one, start a
single worker on the 3 workers' checkpoint (a resized world is allowed; the refusal and the
finished result do not depend on it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from hapi_client import ExtractOptions, TrainOptions
from hapi_client.datasets import get_source, upload_dataset
from hapi_client.distributed import (
    DistributedConfig,
    DistributedResult,
    LaunchError,
    delivered,
    launch,
    read_sample_log,
    torchrun_command,
)
from tests.hapi_client.conftest import ClientEnv
from tests.hapi_client.distributed.torchrun_jobs import checkpoint_round, torchrun_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.swift]

WORKERS, SAMPLES, SHARD, BATCH, EPOCHS = 3, 480, 40, 48, 2
ROUNDS_PER_EPOCH = SAMPLES // BATCH
#: Workers of the jobs that only resume a finished checkpoint or are refused one.
ONE = 1
CONTAINER = "resume-fmnist-train"
EVERY_SAMPLE = sorted((s, i) for s in range(SAMPLES // SHARD) for i in range(SHARD))


@pytest.fixture(scope="module")
def base(client_env: ClientEnv) -> DistributedConfig:
    conn = client_env.stack.connection()
    source = get_source(f"fashion-mnist:train?limit={SAMPLES}")
    upload_dataset(conn, source, CONTAINER, shard_size=SHARD, progress=False)
    conn.close()
    return DistributedConfig(
        model=client_env.models["efficientnet_lite0"].name,
        container=CONTAINER,
        endpoint=client_env.server.url,
        train=TrainOptions(batch_size=BATCH, epochs=EPOCHS, lr=0.003, momentum=0.9, seed=0),
        extract=ExtractOptions(split=21, freeze_index=21, image_size=64),
        straggler_rank=2,
        straggler_delay_s=0.02,
        gather_timeout_s=120,
        channel_timeout_s=120,
    )


def _killed_run(
    client_env: ClientEnv, config: DistributedConfig, work: Path
) -> tuple[DistributedResult, list[dict[str, Any]], float]:
    """Run ``config`` under torchrun with one restart allowed; kill rank 1 a few rounds into the
    second epoch, after a checkpoint; returns the result, the sample log and the kill time."""
    config_path = work / "config.json"
    config_path.write_text(config.to_json())
    # See docs/robust.md: without it a restarted worker group meets the old group's keys.
    env = torchrun_env(client_env.credentials, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    cmd = torchrun_command(
        WORKERS, [config_path], log_level="info", extra_args=["--max-restarts", "1"]
    )
    log_dir = Path(str(config.sample_log_dir))
    kill_after = ROUNDS_PER_EPOCH + 2  # a checkpoint every 2 rounds
    with (work / "torchrun.log").open("wb") as out:
        proc = subprocess.Popen(  # noqa: S603
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            ckpt_dir = Path(str(config.checkpoint_dir))
            wait_for(
                f"a checkpoint of round {kill_after}",
                lambda: checkpoint_round(ckpt_dir) >= kill_after,
                proc,
            )
            victim = next(
                r["pid"]
                for r in read_sample_log(log_dir)
                if r["event"] == "start" and r["rank"] == 1
            )
            os.kill(victim, signal.SIGKILL)
            killed_at = time.time()
            returncode = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    log_tail = (work / "torchrun.log").read_text(errors="replace")[-4000:]
    assert returncode == 0, log_tail
    result = DistributedResult.from_dict(json.loads(Path(str(config.results_path)).read_text()))
    return result, read_sample_log(log_dir), killed_at


def _attempts(records: list[dict[str, Any]]) -> list[int]:
    return sorted({r["attempt"] for r in records})


def _fetched(records: list[dict[str, Any]], attempt: int) -> int:
    """Bytes the ranks of one start fetched (each rank's counter, at its last line)."""
    last: dict[int, int] = {}
    for r in records:
        if r["event"] in ("round", "end") and r["attempt"] == attempt:
            last[r["rank"]] = max(last.get(r["rank"], 0), r["wire_bytes"])
    return sum(last.values())


def _outputs(config: DistributedConfig, work: Path) -> DistributedConfig:
    return config.replace(
        checkpoint_dir=str(work / "ckpt"),
        checkpoint_every=2,
        sample_log_dir=str(work / "samples"),
        results_path=str(work / "results.json"),
        save_path=str(work / "weights.safetensors"),
    )


@dataclass(frozen=True)
class Uninterrupted:
    config: DistributedConfig
    result: DistributedResult


@pytest.fixture(scope="module")
def uninterrupted(
    client_env: ClientEnv, base: DistributedConfig, tmp_path_factory: pytest.TempPathFactory
) -> Uninterrupted:
    work = tmp_path_factory.mktemp("uninterrupted")
    config = _outputs(base, work)
    result = launch(
        WORKERS, config, credentials=client_env.credentials, log_path=work / "torchrun.log"
    )
    return Uninterrupted(config, result)


def test_a_killed_worker_resumes_from_the_checkpoint_every_sample_once(
    client_env: ClientEnv, base: DistributedConfig, uninterrupted: Uninterrupted, tmp_path: Path
) -> None:
    config = _outputs(base, tmp_path).replace(feature_cache_dir=str(tmp_path / "features"))
    result, records, killed_at = _killed_run(client_env, config, tmp_path)

    first, second = _attempts(records)
    resumed = next(
        r["resumed_round"] for r in records if r["event"] == "start" and r["attempt"] == second
    )
    assert ROUNDS_PER_EPOCH < resumed < EPOCHS * ROUNDS_PER_EPOCH
    assert result.resumed_round == resumed
    by_epoch = delivered(records)
    assert sorted(by_epoch) == list(range(EPOCHS))
    for epoch, samples in by_epoch.items():
        assert sorted(samples) == EVERY_SAMPLE, f"epoch {epoch + 1}"
    assert [m.samples for m in result.history] == [SAMPLES] * EPOCHS
    assert [m.rounds for m in result.history] == [ROUNDS_PER_EPOCH] * EPOCHS

    # Same world, same rounds, same seeds: the resumed run ends where the uninterrupted one did.
    mine = load_file(str(config.save_path))
    theirs = load_file(str(uninterrupted.config.save_path))
    assert mine.keys() == theirs.keys()
    assert all(bool((mine[k] == theirs[k]).all()) for k in mine)

    first_round_again = min(
        r["t"] for r in records if r["event"] == "round" and r["attempt"] == second
    )
    again = _fetched(records, second)
    print(
        f"\ndisk cache: killed rank 1 after round {resumed}+; training again "
        f"{first_round_again - killed_at:.1f} s after the kill; fetched "
        f"{_fetched(records, first)} bytes before the kill, {again} after the restart"
    )
    assert _fetched(records, first) > 0
    assert again == 0  # every shard was on the node's disk


def _alone(config: DistributedConfig) -> DistributedConfig:
    """``config`` for :data:`ONE` worker: no rank 2 to slow down (not part of the fingerprint)."""
    return config.replace(straggler_rank=None, straggler_delay_s=0.0)


def test_a_finished_checkpoint_resumes_to_the_same_result(
    client_env: ClientEnv, uninterrupted: Uninterrupted, tmp_path: Path
) -> None:
    config = _alone(uninterrupted.config).replace(
        results_path=str(tmp_path / "results.json"),
        save_path=str(tmp_path / "weights.safetensors"),
    )
    again = launch(ONE, config, credentials=client_env.credentials)
    assert again.resumed_round == EPOCHS * ROUNDS_PER_EPOCH
    assert [m.loss for m in again.history] == [m.loss for m in uninterrupted.result.history]
    mine = load_file(str(config.save_path))
    theirs = load_file(str(uninterrupted.config.save_path))
    assert mine.keys() == theirs.keys()
    assert all(bool((mine[k] == theirs[k]).all()) for k in mine)


def test_another_runs_checkpoint_directory_is_refused(
    client_env: ClientEnv, uninterrupted: Uninterrupted
) -> None:
    config = _alone(uninterrupted.config)
    other = config.replace(train=config.train.replace(seed=1))
    with pytest.raises(
        LaunchError, match=r"belongs to another run \(seed: checkpoint 0, this run 1\)"
    ):
        launch(ONE, other, credentials=client_env.credentials)
