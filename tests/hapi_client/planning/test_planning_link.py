"""The link as the epoch uses it, against the real Swift: a ``folder`` dataset's bandwidth is the
link's, not the rate of its small GETs one by one.

The same photos (about 100 KB each, ImageNet-size) are uploaded as one shard and put one object
each and indexed in place; a fresh client (no bandwidth estimate yet) measures the costs of
each. Both figures are the one loopback link's, so they agree within 2x: before, the folder's
came from the GETs of every image of its first part and was a small fraction of the shard's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import hapi_models
import pytest
import torch

from hapi_client.datasets import get_source, upload_dataset
from hapi_client.planning import PipelineCosts, measure_pipeline_costs
from hapi_client.preparation import prepare_model
from hapi_contract import Compression, OutputDtype
from tests.hapi_client.conftest import ClientEnv
from tests.in_place_data import index_photos_in_place

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
MODEL = "efficientnet_lite0"
SOURCE = "photos:train?per_class=8&size=480x360"


def _unique(tag: str) -> str:
    return f"plan-link-{tag}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def datasets(
    client_env: ClientEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The same photos as one shard (``shards``) and one object each (``folder``)."""
    conn = client_env.stack.connection()
    shards, data, index = _unique("shards"), _unique("images"), _unique("index")
    source = get_source(SOURCE)
    upload_dataset(conn, source, shards, shard_size=1000, progress=False)
    index_photos_in_place(
        conn,
        SOURCE,
        data,
        index,
        part_size=1000,
        state_dir=tmp_path_factory.mktemp("plan-link-index"),
    )
    conn.close()
    yield {"shards": shards, "folder": index}


def _costs(env: ClientEnv, container: str) -> PipelineCosts:
    with env.client() as preparing:
        prepared = prepare_model(preparing, env.models[MODEL].name, container, transform=SMALL)
    # A fresh client: no estimate yet, so the plan's own read measures the link.
    with env.client() as client:
        assert client.bandwidth.bytes_per_s is None
        return measure_pipeline_costs(
            client.swift,
            client.transport,
            prepared,
            container,
            output_dtype=OutputDtype("float16"),
            compression=Compression("none"),
            device=torch.device("cpu"),
            b_max=16,
        )


def test_a_folder_datasets_link_is_measured_as_the_shards_one(
    client_env: ClientEnv, datasets: dict[str, str]
) -> None:
    shard = _costs(client_env, datasets["shards"])
    folder = _costs(client_env, datasets["folder"])
    assert shard.probed_bytes_per_s is not None and folder.probed_bytes_per_s is not None
    ratio = folder.probed_bytes_per_s / shard.probed_bytes_per_s
    assert 0.5 <= ratio <= 2.0, (folder.probed_bytes_per_s * 8e-6, shard.probed_bytes_per_s * 8e-6)
    # The per-image reads are measured apart, at the epoch's read concurrency, for the folder
    # only: one shard object costs one request per hundreds of samples.
    assert folder.objects_per_s is not None and folder.objects_per_s > 0
    assert shard.objects_per_s is None
    assert folder.server is not None and shard.server is not None
