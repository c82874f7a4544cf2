"""The examples/ scripts run as a user runs them, against the real Swift and HAPI server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import hapi_models
import pytest

from hapi_client.datasets import get_source, upload_dataset

from .conftest import ClientEnv

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODEL = "efficientnet_lite0"


def _connection_args(env: ClientEnv) -> list[str]:
    stack = env.stack
    return [
        "--endpoint", env.server.url, "--auth-url", stack.auth_url,
        "--user", stack.admin_user, "--key", stack.admin_key,
        "--model", env.models[MODEL].name, "--image-size", "64", "--split", "freeze",
    ]  # fmt: skip


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_own_loop_example_trains_checkpoints_and_resumes(
    client_env: ClientEnv, tmp_path: Path
) -> None:
    cmd = [
        sys.executable, str(EXAMPLES / "own_loop.py"), *_connection_args(client_env),
        "--container", client_env.train, "--eval-container", client_env.test,
        "--epochs", "2", "--batch-size", "16", "--lr", "3e-3",
    ]  # fmt: skip
    stopped = _run([*cmd, "--stop-after", "2"], tmp_path)
    assert "stopped after 2 batches of epoch 1" in stopped
    resumed = _run(cmd, tmp_path)
    assert "resumed at epoch 1, batch 2" in resumed
    assert "epoch 1:" in resumed and "epoch 2:" in resumed and "held-out accuracy" in resumed
    model = hapi_models.get_model(MODEL, num_classes=10, weights=tmp_path / "finetuned.safetensors")
    assert model.num_classes == 10


def test_ddp_example_on_two_ranks_with_uneven_shards(client_env: ClientEnv, tmp_path: Path) -> None:
    conn = client_env.stack.connection()
    manifest = upload_dataset(
        conn, get_source("photos:train?per_class=8&size=96x72"), "uneven-ddp", shard_size=7,
        progress=False,
    )  # fmt: skip
    conn.close()
    assert manifest.num_samples % 7 != 0  # eleven shards of 7 and one of 3
    torchrun = Path(sys.executable).with_name("torchrun")
    out = _run(
        [
            str(torchrun), "--standalone", "--nproc_per_node", "2", str(EXAMPLES / "ddp_train.py"),
            *_connection_args(client_env), "--container", "uneven-ddp", "--epochs", "2",
            "--batch-size", "8",
        ],
        tmp_path,
    )  # fmt: skip
    # Equal batch counts on both ranks (DDP would hang otherwise), every sample once per epoch.
    # Searched anywhere in the output: the two ranks write to one pipe.
    per_rank = re.findall(r"rank (\d): (\d+) samples, (\d+) batches", out)
    assert sorted(r for r, _, _ in per_rank) == ["0", "0", "1", "1"]
    assert {b for _, _, b in per_rank} == {"6"}
    assert sum(int(s) for _, s, _ in per_rank) == 2 * manifest.num_samples
    assert out.count(f"epoch 1: {manifest.num_samples} samples") == 1
    model = hapi_models.get_model(
        MODEL, num_classes=10, weights=tmp_path / "finetuned-ddp.safetensors"
    )
    assert model.num_classes == 10
