"""Faults during a sweep on a real server and Swift, with the feature store at its default bound
(issue 32): the client of the request that computes leaves while another request waits for the
same features, and the waiting request still gets every sample once, from that computation."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hapi_core.settings import CoreSettings
from hapi_stack import RunningStack

from .conftest import Dataset, ServerProcess, make_images
from .server_helpers import extract, metric, put_shard, wait_for

SAMPLES = 60


@pytest.fixture(scope="module")
def default_store_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    # The default bound, named: the test servers turn the store off unless asked.
    return server_factory(
        cpu_memory_budget_bytes=3 * 2**30,
        b_min=1,
        feature_store_bytes=CoreSettings().feature_store_bytes,
    )


def counter(server: ServerProcess, name: str) -> float:
    return metric(server, f"hapi_feature_store_{name}_total") or 0.0


def test_a_leader_whose_client_leaves_computes_on_for_the_request_waiting(
    default_store_server: ServerProcess, dataset: Dataset, swift_stack: RunningStack
) -> None:
    server = default_store_server
    images, labels = make_images(SAMPLES, seed=3201)
    put_shard(swift_stack, "shared/leaving.tar", images, labels)
    # Split 1 in float32 at COS batches of 2: about 15 MB of frames, more than the sockets and
    # the server's frame queue hold, so the leader's job waits on its client's reads.
    body = dataset.request("resnet18", "shared/leaving.tar", 1, b_max=2, output_dtype="float32")
    misses, coalesced = counter(server, "misses"), counter(server, "coalesced")
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=120) as leaving:
        with leaving.stream(
            "POST", f"{server.url}/v1/extract", json=body, headers=dataset.headers()
        ) as lead:
            assert lead.status_code == 200
            wait_for(lambda: counter(server, "misses") == misses + 1, "the leader's computation")
            waiting = pool.submit(extract, server, dataset, {**body, "b_max": 7})
            wait_for(
                lambda: counter(server, "coalesced") == coalesced + 1,
                "the second request to join the leader's computation",
            )
            # Leaving the block closes the leader's connection with most of its stream unread.
        got = waiting.result(timeout=300)

    assert got.end.meta["shared"] == "coalesced"  # served by the leader's job, not its own
    covered = [i for f in got.frames for i in range(f.offset, f.offset + f.count)]
    assert covered == list(range(SAMPLES))
    assert got.labels == labels
    assert [f.count for f in got.frames] == [7] * 8 + [4]  # at its own b_max
    assert counter(server, "misses") == misses + 1  # nobody computed a second time
