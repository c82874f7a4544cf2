"""The shared feature store in the filter's in-proxy execution (issue 32): a repeated request is
served the stored features at its own COS batch, a caller the proxy refuses the shard gets 403
after the store was filled, an overwritten shard is computed again."""

from __future__ import annotations

from collections.abc import Callable

import hapi_models
import pytest
import torch

from hapi_stack import OTHER_USER, RunningStack
from tests.hapi_server.conftest import make_images, shard_bytes
from tests.swift_middleware.mw_support import MwData, ProxyProcess, extract, shard_url

pytestmark = pytest.mark.swift

DATA = "hapi-mw-shared-data"
MODELS = "hapi-mw-shared-models"
SHARD = "shared.tar"


@pytest.fixture(scope="module")
def sharing_proxy(proxy_factory: Callable[..., ProxyProcess]) -> ProxyProcess:
    return proxy_factory(execution="in_proxy", torch_threads="1", feature_store_bytes=str(2**27))


@pytest.fixture(scope="module")
def shared_body(swift_stack: RunningStack) -> dict[str, object]:
    """Weights the other user may read (so a refusal is the shard's), in containers of this
    module's own; the body as :meth:`MwData.body` builds it."""
    conn = swift_stack.connection()
    try:
        conn.put_container(DATA)
        conn.put_container(MODELS, headers={"X-Container-Read": OTHER_USER.name})
        torch.manual_seed(2)
        blob = hapi_models.weights_to_bytes(hapi_models.get_model("alexnet", num_classes=3))
        conn.put_object(MODELS, "alexnet.safetensors", blob)
    finally:
        conn.close()
    return {
        "model": {
            "arch": "alexnet",
            "num_classes": 3,
            "weights": {
                "container": MODELS,
                "object": "alexnet.safetensors",
                "sha256": hapi_models.sha256_hex(blob),
            },
        },
        "split_index": 3,
        "transform": {"resize": 64, "crop": 64, "mean": [0.5] * 3, "std": [0.25] * 3},
        "b_max": 4,
    }


def put(swift_stack: RunningStack, seed: int) -> list[int]:
    images, labels = make_images(9, seed=seed)
    labels = [(label + seed) % 3 for label in labels]
    conn = swift_stack.connection()
    try:
        conn.put_object(DATA, SHARD, shard_bytes(images, labels))
    finally:
        conn.close()
    return labels


def test_in_proxy_store_serves_repeats_refuses_strangers_and_follows_overwrites(
    sharing_proxy: ProxyProcess,
    shared_body: dict[str, object],
    mw_data: MwData,
    swift_stack: RunningStack,
) -> None:
    url = shard_url(sharing_proxy, DATA, SHARD)
    labels = put(swift_stack, seed=40)
    first = extract(url, shared_body, mw_data.headers())
    assert first.status == 200, first.body
    assert first.end is not None and "shared" not in first.end.meta
    again = extract(url, {**shared_body, "b_max": 5}, mw_data.headers())
    assert again.status == 200, again.body
    assert again.end is not None and again.end.meta["shared"] == "hit"
    assert [f.count for f in again.frames] == [5, 4]  # its own COS batch
    assert again.labels() == first.labels() == labels
    assert torch.equal(again.features(), first.features())

    # test2:tester2 may read the weights, not the shard: refused, the store notwithstanding.
    stranger = extract(url, shared_body, mw_data.headers(mw_data.other_token))
    assert stranger.status == 403, stranger.body
    assert stranger.frames == []

    new_labels = put(swift_stack, seed=41)
    changed = extract(url, shared_body, mw_data.headers())
    assert changed.status == 200, changed.body
    assert changed.end is not None and "shared" not in changed.end.meta  # computed again
    assert changed.labels() == new_labels != labels
    assert not torch.allclose(changed.features(), first.features())
