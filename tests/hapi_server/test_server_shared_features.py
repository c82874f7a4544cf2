"""One extraction for many jobs on a real server and Swift: identical concurrent requests are
computed once and each gets its samples once, in order, at its own COS batch; the store never
bypasses a caller's access; an overwritten shard is computed again (issue 32)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hapi_stack import RunningStack

from .conftest import MODELS, Dataset, ServerProcess, make_images
from .server_helpers import Extraction, assert_error, extract, metric, post, put_shard

SHARED_MODELS = "hapi-test-shared-models"


@pytest.fixture(scope="module")
def shared_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory(cpu_memory_budget_bytes=3 * 2**30, b_min=4, feature_store_bytes=2**28)


def counter(server: ServerProcess, name: str) -> float:
    return metric(server, f"{name}_total") or 0.0


def counts(server: ServerProcess) -> dict[str, float]:
    names = ("computations", "hits", "coalesced", "misses")
    full = {
        "computations": "hapi_extract_computations",
        "hits": "hapi_feature_store_hits",
        "coalesced": "hapi_feature_store_coalesced",
        "misses": "hapi_feature_store_misses",
    }
    return {n: counter(server, full[n]) for n in names}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def check_once_in_order(got: Extraction, labels: list[int], b_max: int) -> None:
    """Every sample once, in shard order, in frames no larger than the request's own b_max."""
    offsets = [f.offset for f in got.frames]
    assert offsets == sorted(offsets)
    covered = [i for f in got.frames for i in range(f.offset, f.offset + f.count)]
    assert covered == list(range(len(labels)))
    assert got.labels == labels
    assert all(f.count <= b_max for f in got.frames)
    assert got.end.samples == len(labels)


def test_identical_concurrent_requests_compute_once(
    shared_server: ServerProcess, dataset: Dataset, swift_stack: RunningStack
) -> None:
    images, labels = make_images(20, seed=32)
    put_shard(swift_stack, "shared/concurrent.tar", images, labels)
    before = counts(shared_server)
    bodies = [
        dataset.request("resnet18", "shared/concurrent.tar", 5, b_max=b_max) for b_max in (16, 3)
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda b: extract(shared_server, dataset, b), bodies))
    changed = delta(counts(shared_server), before)
    assert changed["computations"] == 1, changed
    assert changed["hits"] + changed["coalesced"] == 1, changed
    for got, body in zip(results, bodies, strict=True):
        check_once_in_order(got, labels, int(body["b_max"]))  # type: ignore[call-overload]
    first, second = (torch.cat([f.features for f in r.frames]) for r in results)
    assert torch.equal(first, second)  # the same computation's bytes
    # The request served from the shared features is framed at its own b_max of 3.
    small = results[1]
    assert [f.count for f in small.frames] == [3] * 6 + [2]


def test_caller_without_read_access_is_refused_after_the_store_is_filled(
    shared_server: ServerProcess, dataset: Dataset, swift_stack: RunningStack
) -> None:
    images, labels = make_images(7, seed=33)
    put_shard(swift_stack, "shared/private.tar", images, labels)
    # The weights are readable by test2:tester2, the shard is not: the refusal is the shard's.
    conn = swift_stack.connection()
    try:
        obj, _ = dataset.weights["alexnet"]
        _, blob = conn.get_object(MODELS, obj)
        conn.put_container(SHARED_MODELS, headers={"X-Container-Read": swift_stack.other_user})
        conn.put_object(SHARED_MODELS, obj, blob)
    finally:
        conn.close()
    body = dataset.request("alexnet", "shared/private.tar", 3)
    body["model"]["weights"]["container"] = SHARED_MODELS  # type: ignore[index]
    extract(shared_server, dataset, body)  # the owner's job fills the store
    hits = counter(shared_server, "hapi_feature_store_hits")
    assert extract(shared_server, dataset, body).end.samples == 7  # served from the store
    assert counter(shared_server, "hapi_feature_store_hits") == hits + 1
    # test2:tester2 asks for the same objects of account "test", where it has no ACL.
    other = swift_stack.connection(swift_stack.other_user, swift_stack.other_key, account="test")
    try:
        _, token = other.get_auth()
    finally:
        other.close()
    headers = {"X-Auth-Token": token, "X-Storage-Url": swift_stack.account_url("test")}
    refused = assert_error(post(shared_server, body, headers), 403, "forbidden")
    assert "private.tar" in refused.detail
    assert counter(shared_server, "hapi_feature_store_hits") == hits + 1


def test_overwritten_shard_is_computed_again(
    shared_server: ServerProcess, dataset: Dataset, swift_stack: RunningStack
) -> None:
    old_images, old_labels = make_images(7, seed=34)
    put_shard(swift_stack, "shared/rewritten.tar", old_images, old_labels)
    body = dataset.request("alexnet", "shared/rewritten.tar", 3)
    old = extract(shared_server, dataset, body)
    new_images, _ = make_images(7, seed=35)
    new_labels = [(label + 1) % 3 for label in old_labels]
    put_shard(swift_stack, "shared/rewritten.tar", new_images, new_labels)
    before = counts(shared_server)
    new = extract(shared_server, dataset, body)
    changed = delta(counts(shared_server), before)
    assert changed["computations"] == 1 and changed["hits"] == 0, changed
    assert new.labels == new_labels
    old_features = torch.cat([f.features for f in old.frames])
    new_features = torch.cat([f.features for f in new.frames])
    assert not torch.allclose(old_features, new_features)
    # The new object's features are stored now, and served.
    again = extract(shared_server, dataset, body)
    assert torch.equal(torch.cat([f.features for f in again.frames]), new_features)
    assert again.labels == new_labels
