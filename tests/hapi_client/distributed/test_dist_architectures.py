"""Multi-worker fine-tuning of a network cut at its graph's split points (issue 20.4).

The thesis' networks are cut by hand; every other torchvision network is cut where its torch.fx
graph allows. Three torchrun workers fine-tune MobileNetV3-S through the real HAPI server with
the median rule (f = 1) and ``split="auto"``: rank 0 measures the costs of the graph's split
points and the others agree on its choice, the robust path aggregates, and every photo is
trained on once.
"""

from __future__ import annotations

import hapi_models
import pytest

from hapi_client import ExtractOptions, TrainOptions, upload_model
from hapi_client.distributed import DistributedConfig, launch_many
from tests.hapi_client.conftest import ClientEnv

pytestmark = [pytest.mark.slow, pytest.mark.swift]

ARCH = "mobilenet_v3_small"


def test_three_workers_fine_tune_a_graph_cut_network_with_the_median(
    client_env: ClientEnv, tmp_path_factory: pytest.TempPathFactory
) -> None:
    conn = client_env.stack.connection()
    stored, _ = upload_model(conn, ARCH, container="client-models")
    manifest = client_env.client().manifest(client_env.train)
    conn.close()
    config = DistributedConfig(
        model=stored.name,
        container=client_env.train,
        endpoint=client_env.server.url,
        train=TrainOptions(batch_size=6, epochs=1, lr=0.01, seed=0),
        extract=ExtractOptions(split="auto", image_size=64, cache_features=False),
        aggregator="median",
        f=1,
        gather_timeout_s=300,
    )
    (result,) = launch_many(
        3,
        [config],
        credentials=client_env.credentials,
        log_path=tmp_path_factory.mktemp("dist-arch") / "torchrun.log",
        timeout_s=600,
    )
    spec = hapi_models.get_spec(ARCH)
    assert result.world_size == 3 and (result.aggregator, result.f) == ("median", 1)
    assert result.freeze_index == spec.default_freeze_index
    assert 0 <= result.split_index <= result.freeze_index
    (epoch,) = result.history
    assert epoch.samples == manifest.num_samples
