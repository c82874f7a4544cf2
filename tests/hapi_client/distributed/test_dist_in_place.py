"""Multi-worker fine-tuning on a dataset indexed in place: 2 torchrun workers, real Swift and a
real HAPI server. The workers read the manifest through the same dataset code as one process,
so the folder layout reaches every request: each part is extracted once and every sample
trained on once per epoch, in HAPI mode and in BASELINE (the workers read the images)."""

from __future__ import annotations

import uuid

import pytest

from hapi_client import ExtractOptions, TrainOptions
from hapi_client.datasets import get_source, index_dataset
from hapi_client.distributed import DistributedConfig, launch_many
from tests.hapi_client.conftest import ClientEnv

pytestmark = [pytest.mark.slow, pytest.mark.swift]


def test_two_workers_train_on_a_folder_dataset(
    client_env: ClientEnv, tmp_path_factory: pytest.TempPathFactory
) -> None:
    conn = client_env.stack.connection()
    data, index = (f"dist-inplace-{t}-{uuid.uuid4().hex[:8]}" for t in ("photos", "index"))
    conn.put_container(data)
    source = get_source("photos:train?per_class=2&size=96x72")
    for i, (image, ext, label) in enumerate(source):
        conn.put_object(data, f"train/{source.classes[label]}/{i:04d}.{ext}", image)
    manifest = index_dataset(
        conn,
        data,
        layout="folder",
        prefix="train",
        into=index,
        shard_size=5,
        state_dir=tmp_path_factory.mktemp("dist-index"),
        progress=False,
    )
    conn.close()
    base = DistributedConfig(
        model=client_env.models["efficientnet_lite0"].name,
        container=index,
        endpoint=client_env.server.url,
        train=TrainOptions(batch_size=10, epochs=1, lr=0.01, seed=0),
        extract=ExtractOptions(split="freeze", image_size=64, cache_features=False),
        gather_timeout_s=300,
    )
    hapi, baseline = launch_many(
        2,
        [base, base.replace(mode="baseline")],
        credentials=client_env.credentials,
        log_path=tmp_path_factory.mktemp("dist-in-place") / "torchrun.log",
        timeout_s=600,
    )
    for result in (hapi, baseline):
        (epoch,) = result.history
        assert epoch.samples == manifest.num_samples
    assert hapi.split_index > 0 and baseline.split_index == 0
    # HAPI: one request per part; BASELINE: the parts and one GET per image.
    assert hapi.history[0].requests == len(manifest.shards)
