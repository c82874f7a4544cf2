"""The single-process recipe's checkpoints against the real stack: a checkpointed run equals an
uninterrupted one, a run killed mid-epoch resumes with every batch trained once, another run's
or a damaged checkpoint is refused."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hapi_models
import pytest
import torch

from hapi_client import FinetuneResult, TrainingCheckpointError
from hapi_client.checkpoint_store import CHECKPOINT_FILE

from .conftest import ClientEnv
from .recipe_job import TRANSFORM, options

ROOT = Path(__file__).resolve().parents[2]
MODEL = "alexnet"  # dropout in its head: the resumed run must draw the same masks (RNG state)


@dataclass
class Recorded:
    result: FinetuneResult
    #: The labels of each training batch, in order.
    labels: list[list[int]]


def _run(env: ClientEnv, monkeypatch: pytest.MonkeyPatch, seed: int = 3, **kwargs: Any) -> Recorded:
    labels: list[list[int]] = []
    real_step = hapi_models.train_step

    def recording_step(*args: Any, **kw: Any) -> tuple[float, int]:
        labels.append(args[2].tolist())
        return real_step(*args, **kw)

    train, extract = options(seed=seed)
    with monkeypatch.context() as patch:
        patch.setattr(hapi_models, "train_step", recording_step)
        with env.client() as client:
            result = client.finetune(
                model=env.models[MODEL].name,
                container=env.train,
                train=train,
                extract=extract,
                transform=TRANSFORM,
                progress=False,
                **kwargs,
            )
    return Recorded(result, labels)


@pytest.fixture(scope="module")
def uninterrupted(client_env: ClientEnv) -> Iterator[Recorded]:
    with pytest.MonkeyPatch.context() as patch:
        yield _run(client_env, patch)


def _assert_same_training(a: FinetuneResult, b: FinetuneResult) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=1e-4, atol=1e-5, msg=key)
    assert [(m.samples, m.iterations) for m in a.history] == [
        (m.samples, m.iterations) for m in b.history
    ]
    for ma, mb in zip(a.history, b.history, strict=True):
        assert ma.loss == pytest.approx(mb.loss, rel=1e-4)
        assert ma.train_accuracy == mb.train_accuracy


@dataclass
class Checkpointed:
    run: Recorded
    #: The finished run's checkpoint; tests that change it work on a copy (:func:`_copy`).
    ckpt: Path


@pytest.fixture(scope="module")
def checkpointed(
    client_env: ClientEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Checkpointed]:
    ckpt = tmp_path_factory.mktemp("checkpointed") / "ckpt"
    with pytest.MonkeyPatch.context() as patch:
        yield Checkpointed(_run(client_env, patch, checkpoint_dir=ckpt, checkpoint_every=4), ckpt)


def test_a_checkpointed_run_equals_an_uninterrupted_one(
    client_env: ClientEnv,
    uninterrupted: Recorded,
    checkpointed: Checkpointed,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ckpt, run = checkpointed.ckpt, checkpointed.run
    _assert_same_training(run.result, uninterrupted.result)
    assert run.labels == uninterrupted.labels
    meta = json.loads((ckpt / CHECKPOINT_FILE).read_text())
    assert (meta["epoch"], meta["dataset"]["batches_done"]) == (2, 0)
    assert len(meta["history"]) == 2
    assert [p.name for p in ckpt.glob("*.safetensors")] == [meta["tensors"]]
    # A finished run's checkpoint gives its result back without training again.
    again = _run(client_env, monkeypatch, checkpoint_dir=ckpt)
    assert again.labels == []
    assert again.result.extra["resumed_from"]["epoch"] == 2
    _assert_same_training(again.result, uninterrupted.result)


def _wait_for_checkpoint(ckpt: Path, iteration: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the job exited early ({proc.returncode})"
        try:
            meta = json.loads((ckpt / CHECKPOINT_FILE).read_text())
        except FileNotFoundError:
            meta = {}
        if meta.get("iteration") == iteration:
            return
        time.sleep(0.05)  # polling interval, not synchronisation
    raise AssertionError(f"no checkpoint of iteration {iteration} within 240 s")


def test_a_killed_run_resumes_mid_epoch_and_trains_every_batch_once(
    client_env: ClientEnv,
    uninterrupted: Recorded,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ckpt, labels_path, config = tmp_path / "ckpt", tmp_path / "labels.jsonl", tmp_path / "job.json"
    per_epoch = len(uninterrupted.labels) // 2
    assert per_epoch == math.ceil(uninterrupted.result.history[0].samples / 4)
    stop_at = per_epoch + 3  # the job stops before this iteration: epoch 2, 2 batches into it
    creds = client_env.credentials
    config.write_text(
        json.dumps(
            {
                "endpoint": client_env.server.url,
                "credentials": {"auth_url": creds.auth_url, "user": creds.user, "key": creds.key},
                "model": client_env.models[MODEL].name,
                "container": client_env.train,
                "checkpoint_dir": str(ckpt),
                "labels_path": str(labels_path),
                "stop_at": stop_at,
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (tmp_path / "job.log").open("wb") as log:
        proc = subprocess.Popen(  # noqa: S603
            [sys.executable, str(ROOT / "tests/hapi_client/recipe_job.py"), str(config)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_for_checkpoint(ckpt, stop_at - 1, proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = [json.loads(line) for line in labels_path.read_text().splitlines()]
    assert len(before) == stop_at - 1

    resumed = _run(client_env, monkeypatch, checkpoint_dir=ckpt)
    assert resumed.result.extra["resumed_from"] == {
        "epoch": 1,
        "batches_done": 2,
        "iteration": stop_at - 1,
    }
    # Every batch once, in the uninterrupted order: the killed job's, then the resumed run's.
    assert before + resumed.labels == uninterrupted.labels
    _assert_same_training(resumed.result, uninterrupted.result)
    assert [m.samples for m in resumed.result.history] == [
        uninterrupted.result.history[0].samples
    ] * 2


def _copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(source, target)
    return target


def test_another_runs_checkpoint_is_refused_naming_the_field(
    client_env: ClientEnv,
    checkpointed: Checkpointed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ckpt = _copy(checkpointed.ckpt, tmp_path)
    with pytest.raises(TrainingCheckpointError, match=r"seed: checkpoint 3, this run 4") as info:
        _run(client_env, monkeypatch, seed=4, checkpoint_dir=ckpt)
    assert "weights_sha256" not in str(info.value)


def test_a_damaged_tensors_file_is_refused(
    client_env: ClientEnv,
    checkpointed: Checkpointed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ckpt = _copy(checkpointed.ckpt, tmp_path)
    tensors = next(ckpt.glob("*.safetensors"))
    data = bytearray(tensors.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tensors.write_bytes(bytes(data))
    with pytest.raises(TrainingCheckpointError, match="sha256"):
        _run(client_env, monkeypatch, checkpoint_dir=ckpt)
