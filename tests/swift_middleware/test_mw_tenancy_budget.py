"""Issue 27's goal on a real in-proxy proxy, scaled down: every request is served or refused
cleanly (200, 503, 504 or 507), and the proxy's sampled peak resident memory, its idle memory
included, stays within the budget plus 10 %.

The proxy runs as the issue's did (``torch_threads`` 1, 2 slots), with a 1 GiB budget and a
128 MiB reserve; the cases are two of the issue's table at sizes that run in seconds:

* eight concurrent requests of 576x576 images (ResNet18 split 3 at 576 px: each sample's
  activations are about 21 MB), each of which fits alone;
* a shard of 160 large JPEGs (about 60 MB) read by two requests at once.

Peak memory and the latency of a bystander's plain GET every 0.5 s through the same proxy
(p50, p99, max) are printed (``-s``); the bound asserted is memory, never time, and that every
bystander GET is answered.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from hapi_stack import RunningStack
from tests.hapi_server.conftest import make_images, shard_bytes
from tests.swift_middleware.mw_support import MW_DATA, MwData, ProxyProcess, extract, shard_url
from tests.swift_middleware.test_mw_in_proxy_waits import RssPeak

pytestmark = pytest.mark.swift

# Measured here (2 shared cores, budget 1024 MiB, bound 1126): eight 576 px requests, all 200,
# peak 2001-2131 MiB with glibc's default malloc (1903 MiB still resident once all had ended:
# per-thread arenas and the dynamic mmap threshold kept what requests freed), 989 MiB with
# hapi_core.host_allocator's bound; the large shard twice, both 200, 1136 MiB before, 982 after.
# The bystander during the eight requests (the proxy's first): p99 2739-5566 ms while the
# first request imported torch on the proxy's hub, 250-556 ms once the filter imports the core
# when it is built (swift_middleware/in_proxy.py), 912 ms at a load average of 16 on the 2
# cores; during the large shard, p99 150-563 ms. Later the eight requests peaked at 1139-1180
# MiB in some interleavings: a request admitted while another had not reached its batches yet
# was planned beside that one's unused plan as if it were free (the memory outside the plan
# read 453 MiB where 624 MiB had been measured with nothing running); with the idle
# measurement as the floor, 980-997 MiB over five runs.
BUDGET = 1 << 30
RESERVE = 128 << 20
CLEAN = {200, 503, 504, 507}
LARGE_IMAGES = "tenancy/eight-576.tar"
LARGE_SHARD = "tenancy/large-160.tar"


@pytest.fixture(scope="module")
def budget_proxy(
    proxy_factory: Callable[..., ProxyProcess], swift_stack: RunningStack, mw_data: MwData
) -> ProxyProcess:
    conn = swift_stack.connection()
    conn.put_object(MW_DATA, LARGE_IMAGES, shard_bytes(*make_images(8, seed=51, side=576)))
    conn.put_object(MW_DATA, LARGE_SHARD, shard_bytes(*make_images(160, seed=52, side=576)))
    conn.close()
    return proxy_factory(
        execution="in_proxy",
        torch_threads="1",
        max_concurrent="2",
        memory_budget_bytes=str(BUDGET),
        framework_reserve_bytes=str(RESERVE),
        queue_limit="16",
        request_timeout="300",
        b_min="1",
    )


class Bystander:
    """A plain GET through the proxy every 0.5 s while a case runs; its latencies."""

    def __init__(self, proxy: ProxyProcess, token: str) -> None:
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(proxy, token), daemon=True)
        self._thread.start()

    def _run(self, proxy: ProxyProcess, token: str) -> None:
        while not self._stop.wait(0.5):
            start = time.perf_counter()
            try:
                resp = httpx.get(shard_url(proxy), headers={"X-Auth-Token": token}, timeout=60)
            except httpx.HTTPError:
                self.failures += 1
                continue
            if resp.status_code == 200:
                self.latencies.append(time.perf_counter() - start)
            else:
                self.failures += 1

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(65)
        return (
            f"bystander GETs {len(self.latencies)} ({self.failures} failed), "
            f"{latency_summary(self.latencies)}"
        )


def latency_summary(latencies: list[float]) -> str:
    """p50, p99 and max of ``latencies`` (seconds) in ms; p99 is the nearest rank."""
    if not latencies:
        return "no latencies"
    ranked = sorted(latencies)

    def rank(q: float) -> float:
        return ranked[min(len(ranked) - 1, math.ceil(q * len(ranked)) - 1)] * 1000

    return f"p50 {rank(0.50):.0f} ms, p99 {rank(0.99):.0f} ms, max {ranked[-1] * 1000:.0f} ms"


def run_case(
    proxy: ProxyProcess, mw_data: MwData, bodies: list[tuple[str, dict[str, Any]]]
) -> list[int]:
    """Send every request at once; the statuses, with peak memory and bystander printed."""
    rss = RssPeak(proxy.process.pid)
    bystander = Bystander(proxy, mw_data.token)
    try:
        with ThreadPoolExecutor(len(bodies)) as pool:
            statuses = list(
                pool.map(
                    lambda job: (
                        extract(shard_url(proxy, MW_DATA, job[0]), job[1], mw_data.headers()).status
                    ),
                    bodies,
                )
            )
    finally:
        line = f"{rss.stop()}, {bystander.stop()}"
    print(f"\n{statuses}: {line}, budget {BUDGET >> 20} MiB")
    assert set(statuses) <= CLEAN, statuses
    assert bystander.failures == 0, f"plain GETs through the proxy failed: {line}"
    assert rss.peak <= BUDGET * 1.10, (
        f"peak RSS {rss.peak >> 20} MiB over the budget {BUDGET >> 20} MiB + 10 %"
    )
    return statuses


def test_eight_requests_of_large_images_stay_within_the_budget(
    budget_proxy: ProxyProcess, mw_data: MwData
) -> None:
    body = mw_data.body("resnet18", 3, side=576, b_max=8)
    statuses = run_case(budget_proxy, mw_data, [(LARGE_IMAGES, body)] * 8)
    assert 200 in statuses


def test_a_large_shard_read_twice_at_once_stays_within_the_budget(
    budget_proxy: ProxyProcess, mw_data: MwData
) -> None:
    body = mw_data.body("resnet18", 3, b_max=32)
    statuses = run_case(budget_proxy, mw_data, [(LARGE_SHARD, body)] * 2)
    assert 200 in statuses
