"""Ten simultaneous requests against a small memory budget, over real HTTP.

Numbers (resnet18, split 4, 64 px): one sample costs d = 901120 bytes by the server's own
estimate, the weights R = 44.75 MB stay resident, b_max = 32, b_min = 4. Every request also
plans its shard's bytes (about 0.3 MB), and the first load of the model its 44.8 MB blob: the
budget is reserve + R + the larger of 1.5 x 32 x d and the blob plus a small shard (the
fixture loads the model once), so two requests never both get their b_max: whenever requests
overlap, batch adaptation cuts COS batches below b_max (the behaviour of the thesis' Table 5.4),
and ten requests at b_min (10 x (4 x d + their shard) = 39 MB) still fit, so all of them run. The planned memory
(running requests + resident weights, ``hapi_planned_memory_peak_bytes``) must never exceed
the budget minus the framework reserve.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hapi_stack import RunningStack

from .conftest import Dataset, ServerProcess, make_images, shard_bytes
from .server_helpers import TIMEOUT, Extraction, extract, metric, put_object
from .test_server_queue import per_sample, weights_blob, weights_bytes

pytestmark = pytest.mark.slow  # its own server

ARCH, SPLIT, SIDE = "resnet18", 4, 64
B_MIN, B_MAX, N_REQUESTS, SAMPLES = 4, 32, 10, 40
RESERVE = 16 << 20
D = per_sample(ARCH, SIDE, SPLIT)
R = weights_bytes(ARCH)
BUDGET = RESERVE + R + (3 * B_MAX * D) // 2
SHARDS = [f"concurrency/shard-{i:02d}.tar" for i in range(N_REQUESTS)]
DATA = [shard_bytes(*make_images(SAMPLES, seed=100 + i)) for i in range(N_REQUESTS)]
WARM_SHARD = "shards/shard-000001.tar"  # 7 samples, from the session's dataset
WARM = len(shard_bytes(*make_images(7, seed=1)))
BUDGET = max(BUDGET, RESERVE + R + weights_blob(ARCH) + WARM + D)


@pytest.fixture(scope="module")
def budget_server(
    server_factory: Callable[..., ServerProcess], swift_stack: RunningStack, dataset: Dataset
) -> ServerProcess:
    for name, data in zip(SHARDS, DATA, strict=True):
        put_object(swift_stack, name, data)
    server = server_factory(
        devices="cpu",  # the planner on a configured budget (a GPU's would be NVML's, 80 GB)
        # Budgets sized on the weights as built: a folded head's copies are planned beside them.
        fold_batch_norms=False,
        cpu_memory_budget_bytes=BUDGET,
        count_process_memory=False,  # the plan's arithmetic alone, not the server's RSS
        framework_reserve_bytes=RESERVE,
        b_min=B_MIN,
        adaptation_window_s=0.2,  # gather the burst into few rounds
    )
    # The model's first load plans its blob too: load it once, alone.
    warm = extract(server, dataset, dataset.request(ARCH, WARM_SHARD, SPLIT, b_max=B_MAX))
    assert warm.end.samples == 7
    return server


def test_ten_simultaneous_requests_share_the_budget(
    budget_server: ServerProcess, dataset: Dataset
) -> None:
    assert N_REQUESTS * B_MIN * D + sum(map(len, DATA)) <= BUDGET - RESERVE - R < 2 * B_MAX * D
    start = threading.Barrier(N_REQUESTS)

    def one(i: int) -> Extraction:
        with httpx.Client(timeout=TIMEOUT) as client:
            start.wait()
            return extract(
                budget_server, dataset, dataset.request(ARCH, SHARDS[i], SPLIT, b_max=B_MAX), client
            )

    with ThreadPoolExecutor(N_REQUESTS) as pool:
        results = list(pool.map(one, range(N_REQUESTS)))

    planned_sizes = []
    for i, got in enumerate(results):
        assert got.end.samples == SAMPLES
        assert got.labels == [j % 3 for j in range(SAMPLES)]
        assert [f.offset for f in got.frames] == sorted(f.offset for f in got.frames)
        sizes = got.end.meta["cos_batch_sizes"]
        assert sum(sizes) == SAMPLES, (i, sizes)
        planned = int(got.headers["x-hapi-cos-batch-size"])
        assert sizes[0] == planned and all(s <= planned for s in sizes)
        assert B_MIN <= planned <= B_MAX
        planned_sizes.append(planned)
    assert min(planned_sizes) < B_MAX, f"no COS batch was cut: {planned_sizes}"

    peak = metric(budget_server, "hapi_planned_memory_peak_bytes", device="cpu")
    assert peak is not None and R < peak <= BUDGET - RESERVE
    assert metric(budget_server, "hapi_planned_memory_bytes", device="cpu") == 0
    assert metric(budget_server, "hapi_queue_depth", device="cpu") == 0
    rounds = metric(budget_server, "hapi_adaptation_decision_seconds_count", device="cpu")
    assert rounds is not None and rounds >= 1
    print(
        f"\nplanned COS batch sizes: {sorted(planned_sizes)}; peak planned {peak / 2**20:.1f} MiB "
        f"of {(BUDGET - RESERVE) / 2**20:.1f} MiB; {rounds:.0f} planning rounds"
    )
