"""No head-of-line livelock, over real HTTP: a request that waits for weights pinned by a
request queued behind it does not hold up the queue (issue 27's livelock case).

Numbers (each computed from the server's own estimates): model X = efficientnet_lite0 (its
weights R_x stay resident once the fixture has loaded them), model Y = resnet18 (not resident:
its request plans R_y and its blob). The budget is Y's request at b_min plus half of R_x, so Y's
request L fits an idle device, but never beside X's resident weights.

1. A: X over a 600-sample shard, whose client reads nothing: it runs, and pins X.
2. L: Y. It waits; the end of A would let X be evicted, so first come, first served applies.
3. S, another client's small X request: it pins X while it waits, so now no running request's
   end can place L. Before, S waited behind L, and once A ended nothing ran, X stayed pinned by
   S, and both waited until ``request_timeout`` (504). Now S is planned behind L at once and is
   served while A still holds its memory; when A and S have ended, X is evicted and L is served.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest

from hapi_stack import RunningStack

from .conftest import Dataset, ServerProcess, make_images, shard_bytes
from .server_helpers import TIMEOUT, extract, metric, put_object, wait_for
from .test_server_queue import per_sample, weights_blob, weights_bytes

pytestmark = pytest.mark.slow  # its own server

X, Y = "efficientnet_lite0", "resnet18"
SPLIT_X, SPLIT_Y, B_MIN = 0, 4, 4
SMALL_SHARD = "shards/shard-000001.tar"  # 7 samples, from the session's dataset
SMALL = len(shard_bytes(*make_images(7, seed=1)))
BIG_SHARD = "fairness/big-600.tar"
BIG = shard_bytes(*make_images(600, seed=31))
R_X = weights_bytes(X)
D_X, D_Y = per_sample(X, 64, SPLIT_X), per_sample(Y, 64, SPLIT_Y)
# L at b_min: Y's resident weights, its blob (beyond the first batch, which it precedes), its
# shard and its samples.
L_MIN = weights_bytes(Y) + max(weights_blob(Y), B_MIN * D_Y) + SMALL
RESERVE = 1 << 20
BUDGET = RESERVE + L_MIN + R_X // 2


@pytest.fixture(scope="module")
def fair_server(
    server_factory: Callable[..., ServerProcess], swift_stack: RunningStack, dataset: Dataset
) -> ServerProcess:
    put_object(swift_stack, BIG_SHARD, BIG)
    server = server_factory(
        devices="cpu",
        # Budgets sized on the weights as built: a folded head's copies are planned beside them.
        fold_batch_norms=False,
        cpu_memory_budget_bytes=BUDGET,
        count_process_memory=False,  # the plan's arithmetic alone, not the server's RSS
        framework_reserve_bytes=RESERVE,
        b_min=B_MIN,
        request_timeout_s=120,
    )
    warm = extract(server, dataset, dataset.request(X, SMALL_SHARD, SPLIT_X, b_max=B_MIN))
    assert warm.end.samples == 7  # X is resident from here on
    return server


def test_a_request_behind_a_head_no_release_can_place_is_served(
    fair_server: ServerProcess, dataset: Dataset
) -> None:
    capacity = BUDGET - RESERVE
    assert L_MIN <= capacity < L_MIN + R_X  # L fits an idle device, never beside X
    queued = lambda n: metric(fair_server, "hapi_queue_depth", device="cpu") == n  # noqa: E731
    with ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        client_a = stack.enter_context(httpx.Client(timeout=TIMEOUT))
        resp_a = stack.enter_context(
            client_a.stream(
                "POST",
                f"{fair_server.url}/v1/extract",
                json=dataset.request(X, BIG_SHARD, SPLIT_X, b_max=8),
                headers=dataset.headers(),
            )
        )
        assert resp_a.status_code == 200  # A runs; its body stays unread
        large = pool.submit(
            extract, fair_server, dataset, dataset.request(Y, SMALL_SHARD, SPLIT_Y, b_max=B_MIN)
        )
        wait_for(lambda: queued(1.0) or large.done(), "L to wait in the queue")
        assert not large.done(), large.result()

        small = extract(fair_server, dataset, dataset.request(X, SMALL_SHARD, SPLIT_X, b_max=4))
        # S was served while A still runs and L still waits: it did not wait behind L.
        assert small.end.samples == 7 and small.labels == dataset.shards[SMALL_SHARD][1]
        assert not large.done() and queued(1.0)

        stack.close()  # A's client leaves: A ends, X is unpinned and can be evicted for L
        got = large.result(timeout=120)
    assert got.end.samples == 7 and got.labels == dataset.shards[SMALL_SHARD][1]
    wait_for(
        lambda: queued(0.0) and metric(fair_server, "hapi_planned_memory_bytes", device="cpu") == 0,
        "all reservations to be released",
    )
    # /metrics reports the server's resident memory, its peak sampled (VmHWM left alone).
    rss = metric(fair_server, "hapi_process_resident_bytes")
    peak = metric(fair_server, "hapi_process_resident_peak_bytes")
    assert rss is not None and peak is not None and 0 < rss <= peak
    print(
        f"\nbudget {BUDGET / 2**20:.1f} MiB; L needs {L_MIN / 2**20:.1f} MiB at b_min, X holds "
        f"{R_X / 2**20:.1f} MiB; S served {small.end.meta['server_ms']} while L waited; "
        f"server RSS {rss / 2**20:.0f} MiB, sampled peak {peak / 2**20:.0f} MiB"
    )
