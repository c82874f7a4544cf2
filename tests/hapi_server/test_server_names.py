"""Names: the object a request names is the object the server reads, byte for byte.

A ``.`` or ``..`` segment would be removed by the HTTP client on the way to Swift, so such names
are refused at validation (a 422 schema error, ``invalid_request``). Every other name reaches Swift as written, so
names that differ only in ways Swift does not normalise (``a//b`` and ``a/b``; NFC and NFD) are
distinct objects, which is why ``/v1/finetune``'s duplicate-shard check compares them as strings.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import httpx
import pytest
from swiftclient.client import Connection

from hapi_contract import FinetuneRequest
from hapi_stack import RunningStack

from .conftest import DATA, Dataset, ServerProcess, make_images, shard_bytes
from .server_helpers import assert_error

pytestmark = pytest.mark.swift

SHARD = "shards/shard-000000.tar"


def _finetune_body(dataset: Dataset, **extra: Any) -> dict[str, Any]:
    body = dataset.request("alexnet", SHARD, 0)
    for key in ("shard", "split_index"):
        body.pop(key)
    body.update(
        shards=[SHARD],
        freeze_index=4,
        batch_size=4,
        epochs=1,
        optimizer={"lr": 0.01},
    )
    body.update(extra)
    return body


def _weights(dataset: Dataset, **names: str) -> dict[str, Any]:
    body = dataset.request("alexnet", SHARD, 0)
    body["model"]["weights"].update(names)
    return body


EXTRACT_CASES = {
    "dotdot-shard": lambda d: d.request("alexnet", f"x/../{SHARD}", 0),
    "dot-shard": lambda d: d.request("alexnet", f"./{SHARD}", 0),
    "dot-last-segment": lambda d: d.request("alexnet", f"{SHARD}/.", 0),
    "dotdot-container": lambda d: {**d.request("alexnet", SHARD, 0), "container": ".."},
    "dotdot-weights-object": lambda d: _weights(d, object="x/../alexnet.safetensors"),
    "dot-weights-container": lambda d: _weights(d, container="."),
}


@pytest.mark.parametrize("case", list(EXTRACT_CASES))
def test_extract_refuses_dot_segments(
    case: str, hapi_server: ServerProcess, dataset: Dataset
) -> None:
    resp = httpx.post(
        f"{hapi_server.url}/v1/extract",
        json=EXTRACT_CASES[case](dataset),
        headers=dataset.headers(),
        timeout=60,
    )
    body = assert_error(resp, 422, "invalid_request")
    assert "'.' or '..' path segment" in body.detail


@pytest.mark.parametrize(
    "extra",
    [
        {"shards": [SHARD, f"./{SHARD}"]},  # the same shard twice, once through a dot segment
        {"shards": [f"shards/../{SHARD}"]},
        {"eval_shards": [f"./{SHARD}"]},
        {"container": "."},
    ],
)
def test_finetune_refuses_dot_segments(
    extra: dict[str, Any], hapi_server: ServerProcess, dataset: Dataset
) -> None:
    resp = httpx.post(
        f"{hapi_server.url}/v1/finetune",
        json=_finetune_body(dataset, **extra),
        headers=dataset.headers(),
        timeout=60,
    )
    body = assert_error(resp, 422, "invalid_request")
    assert "'.' or '..' path segment" in body.detail


NFC = unicodedata.normalize("NFC", "names/café.tar")
NFD = unicodedata.normalize("NFD", "names/café.tar")
# Each name holds a shard of a different size, so the sample count says which object was read.
LOOKALIKES = {"names/a/b.tar": 2, "names/a//b.tar": 3, "names/a/b.tar/": 4, NFC: 5, NFD: 6}


@pytest.fixture(scope="module")
def lookalikes(swift_stack: RunningStack, dataset: Dataset) -> dict[str, int]:
    conn: Connection = swift_stack.connection()
    for i, (name, n) in enumerate(LOOKALIKES.items()):
        images, labels = make_images(n, seed=100 + i)
        conn.put_object(DATA, name, shard_bytes(images, labels))
    conn.close()
    return LOOKALIKES


@pytest.mark.parametrize("name", list(LOOKALIKES), ids=["a/b", "a//b", "a/b/", "nfc", "nfd"])
def test_lookalike_names_read_their_own_object(
    name: str, lookalikes: dict[str, int], hapi_server: ServerProcess, dataset: Dataset
) -> None:
    assert NFC != NFD
    resp = httpx.post(
        f"{hapi_server.url}/v1/extract",
        json=dataset.request("alexnet", name, 0),
        headers=dataset.headers(),
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    assert int(resp.headers["X-Hapi-Samples"]) == lookalikes[name]


def test_lookalike_names_are_not_duplicate_shards(dataset: Dataset) -> None:
    """They are different objects (above), so the duplicate check must let them through."""
    req = FinetuneRequest.model_validate(_finetune_body(dataset, shards=list(LOOKALIKES)))
    assert list(req.shards) == list(LOOKALIKES)
