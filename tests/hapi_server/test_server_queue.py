"""Queue full (503 + Retry-After) and infeasible (507), deterministically, over real HTTP.

The server's memory budget is computed from the same estimates it plans with, so that one
request at b_min fills the device:

* model efficientnet_lite0 (R = its resident weights), split 0 at 64 px, so one sample costs
  d = 245760 bytes (input, output copy and the two frames in flight, see ``MemoryEstimator``),
  b_min = 25;
* every byte a request causes is planned before it is read: its shard's bytes (from a HEAD)
  and, while the model is not resident, the weights' blob beyond the first COS batch (the
  two never coexist); a shard of unknown count is planned at b_min = min(25, the most
  samples its size can hold);
* budget = framework reserve + R + the weights' blob + the small shard + d: enough to load
  the model once (the fixture does); request A (b_max 64, a 4.9 MB shard) is then planned at
  (capacity - R - its shard) // d = 37 samples and leaves less than a sample free, so
  nothing else fits;
* A's client reads nothing: its shard has 600 samples (16 frames of 37 x 49152 bytes, about
  29 MB at split 0), far more than the server's frame queue (1 frame) plus the socket
  buffers hold, so A's stream stalls and A keeps its reservation;
* request B then waits (``hapi_queue_depth{device="cpu"} 1.0``, polled with a deadline), so
  with ``queue_limit=1`` request C gets 503 with Retry-After. Closing A releases its memory
  and B completes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import hapi_models
import httpx
import pytest
import torch

from hapi_core.estimates import MemoryEstimator
from hapi_stack import RunningStack

from .conftest import SIDE, Dataset, ServerProcess, make_images, shard_bytes
from .server_helpers import TIMEOUT, assert_error, extract, metric, post, put_object, wait_for

pytestmark = pytest.mark.slow  # its own server

ARCH = "efficientnet_lite0"
B_MIN = 25
RESERVE = 1 << 20
BIG_SHARD = "queue/big-600.tar"
SMALL_SHARD = "shards/shard-000001.tar"  # 7 samples, from the session's dataset


def weights_bytes(arch: str) -> int:
    """What the server's weights cache counts for a loaded model (parameters + buffers)."""
    with torch.device("meta"):
        model = hapi_models.get_spec(arch).builder(3, False)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def per_sample(arch: str, side: int, split: int) -> int:
    return MemoryEstimator().estimate(arch, 3, (3, side, side), split, "cpu").bytes_per_sample


def weights_blob(arch: str) -> int:
    """Bytes of the weights object the session's dataset uploads for ``arch``."""
    torch.manual_seed(0)
    pretrained = "imagenet" if arch == "efficientnet_lite0" else None
    model = hapi_models.get_model(arch, num_classes=3, weights=pretrained)
    return len(hapi_models.weights_to_bytes(model))


D = per_sample(ARCH, SIDE, 0)
R = weights_bytes(ARCH)
BIG = shard_bytes(*make_images(600, seed=21))
SMALL_BYTES = len(shard_bytes(*make_images(7, seed=1)))  # the session's shard-000001
BUDGET = RESERVE + R + weights_blob(ARCH) + SMALL_BYTES + D
CAPACITY = BUDGET - RESERVE  # what requests may use, resident weights included
A_BATCH = min(64, (CAPACITY - R - len(BIG)) // D)
SMALL_B_MIN = min(B_MIN, SMALL_BYTES // 1024 + 1)  # the count its size bounds


@pytest.fixture(scope="module")
def tight_server(
    server_factory: Callable[..., ServerProcess], swift_stack: RunningStack, dataset: Dataset
) -> ServerProcess:
    put_object(swift_stack, BIG_SHARD, BIG)
    server = server_factory(
        devices="cpu",  # the queue on a configured CPU budget, GPU or not
        # Budgets sized on the weights as built: a folded head's copies are planned beside them.
        fold_batch_norms=False,
        cpu_memory_budget_bytes=BUDGET,
        count_process_memory=False,  # the plan's arithmetic alone, not the server's RSS
        framework_reserve_bytes=RESERVE,
        b_min=B_MIN,
        queue_limit=1,
        retry_after_s=3,
    )
    assert_serves(server, dataset)  # the model is resident from here on: no blob to plan
    return server


def small_request(dataset: Dataset, **extra: object) -> dict[str, object]:
    return dataset.request(ARCH, SMALL_SHARD, 0, b_max=64, **extra)


def assert_serves(server: ServerProcess, dataset: Dataset) -> None:
    got = extract(server, dataset, small_request(dataset))
    assert got.end.samples == 7 and got.labels == dataset.shards[SMALL_SHARD][1]


@pytest.fixture
def tight(tight_server: ServerProcess, dataset: Dataset) -> Iterator[ServerProcess]:
    yield tight_server
    assert_serves(tight_server, dataset)
    assert metric(tight_server, "hapi_queue_depth", device="cpu") == 0


def test_queue_full_is_503_with_retry_after(tight: ServerProcess, dataset: Dataset) -> None:
    assert 16 * 2**20 <= BUDGET  # the smallest budget the server accepts
    with ExitStack() as stack, ThreadPoolExecutor(1) as pool:
        client_a = stack.enter_context(httpx.Client(timeout=TIMEOUT))
        resp_a = stack.enter_context(
            client_a.stream(
                "POST",
                f"{tight.url}/v1/extract",
                json=dataset.request(ARCH, BIG_SHARD, 0, b_max=64),
                headers=dataset.headers(),
            )
        )
        # A is planned (its status line came) and holds its shard and 37 samples' worth; its
        # body is unread.
        assert resp_a.status_code == 200
        assert int(resp_a.headers["x-hapi-cos-batch-size"]) == A_BATCH == 37
        planned_a = len(BIG) + A_BATCH * D
        assert CAPACITY - R - planned_a < SMALL_BYTES + SMALL_B_MIN * D  # B cannot fit
        assert metric(tight, "hapi_planned_memory_bytes", device="cpu") == planned_a

        b = pool.submit(extract, tight, dataset, small_request(dataset))
        wait_for(
            lambda: metric(tight, "hapi_queue_depth", device="cpu") == 1.0 or b.done(),
            "request B to wait in the queue",
        )
        assert not b.done(), b.result()

        c = post(tight, small_request(dataset), dataset.headers())
        err = assert_error(c, 503, "queue_full")
        assert c.headers["retry-after"] == "3"
        assert "queue_limit" in err.detail
        # A still holds its memory and B still waits: the 503 was not a race with A's end.
        assert metric(tight, "hapi_planned_memory_bytes", device="cpu") == planned_a
        assert metric(tight, "hapi_queue_depth", device="cpu") == 1.0

        stack.close()  # A's client goes away mid-stream: the server releases A's memory
        got_b = b.result(timeout=120)
    assert got_b.end.samples == 7
    assert got_b.labels == dataset.shards[SMALL_SHARD][1]
    assert got_b.end.meta["server_ms"]["queued"] > 0
    wait_for(
        lambda: metric(tight, "hapi_planned_memory_bytes", device="cpu") == 0.0,
        "all reservations to be released",
    )


def test_client_that_gives_up_while_queued_leaks_nothing(
    tight: ServerProcess, dataset: Dataset
) -> None:
    """B's client times out while B waits; B is planned later, for nobody: release at once."""
    with ExitStack() as stack:
        client_a = stack.enter_context(httpx.Client(timeout=TIMEOUT))
        resp_a = stack.enter_context(
            client_a.stream(
                "POST",
                f"{tight.url}/v1/extract",
                json=dataset.request(ARCH, BIG_SHARD, 0, b_max=64),
                headers=dataset.headers(),
            )
        )
        assert resp_a.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            # The server cannot see this client leave: it only reads the socket again later.
            httpx.post(
                f"{tight.url}/v1/extract",
                json=small_request(dataset),
                headers=dataset.headers(),
                timeout=httpx.Timeout(60.0, read=1.0),
            )
        assert metric(tight, "hapi_queue_depth", device="cpu") == 1.0
        stack.close()  # A leaves too; B gets planned, finds its client gone
    wait_for(
        lambda: (
            metric(tight, "hapi_queue_depth", device="cpu") == 0.0
            and metric(tight, "hapi_planned_memory_bytes", device="cpu") == 0.0
        ),
        "the abandoned request's memory to be released",
    )


def _numbers(detail: str) -> tuple[int, int]:
    match = re.search(r"needs (\d+) bytes at its minimum COS batch .* at most (\d+) bytes", detail)
    assert match, detail
    return int(match.group(1)), int(match.group(2))


def test_request_that_cannot_fit_alone_is_507_with_the_numbers(
    tight: ServerProcess, dataset: Dataset
) -> None:
    # The same request at 224 px: its shard and b_min = min(b_min, the samples its size can
    # hold) samples of 1.8 MB each, planned before the shard is read.
    transform = {**dataset.transform(), "resize": 224, "crop": 224}
    body = small_request(dataset, transform=transform)
    err = assert_error(post(tight, body, dataset.headers()), 507, "insufficient_memory")
    needed, offered = _numbers(err.detail)
    assert needed == SMALL_BYTES + SMALL_B_MIN * per_sample(ARCH, 224, 0)
    assert offered == CAPACITY - R  # usable memory minus this model's resident weights
    health = httpx.get(f"{tight.url}/healthz", timeout=10).json()["devices"][0]
    assert health["total_bytes"] == BUDGET and offered < health["total_bytes"]
    assert str(R) in err.detail and "b_max" in err.detail


def test_model_larger_than_the_device_is_507_not_a_wait(
    tight: ServerProcess, dataset: Dataset
) -> None:
    """AlexNet's weights alone (228 MB) exceed this 34 MB device: refuse now, don't queue."""
    body = dataset.request("alexnet", SMALL_SHARD, 3, b_max=64)
    err = assert_error(post(tight, body, dataset.headers()), 507, "insufficient_memory")
    needed, offered = _numbers(err.detail)
    assert offered == 0 and needed == SMALL_BYTES + SMALL_B_MIN * per_sample("alexnet", SIDE, 3)
    held = re.search(r"weights hold (\d+)", err.detail)
    assert held and int(held.group(1)) >= weights_bytes("alexnet"), err.detail
