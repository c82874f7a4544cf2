"""Unit test of ``DeviceScheduler``: weights evicted for a waiter are measured once they are gone.

On a CPU the planner counts the process's resident memory beyond the plan as occupied. Weights
evicted from the cache in a planning round leave the process only once the request that last
ran them has dropped them; in that round they are still resident, no longer counted by the
cache, and so counted outside the plan. A round that evicted refused the waiter 507 on that
reading (issue 27: a ViT-L/16 queued behind a ConvNeXt-L, refused as the ConvNeXt-L ended). The
process and the cache here are fakes: what the cache drops stays resident until the test frees
it.
"""

from __future__ import annotations

import asyncio

import pytest

from hapi_core.adaptation import DeviceScheduler
from hapi_core.devices import Device
from hapi_core.metrics import Metrics
from hapi_core.solver import Demand
from hapi_server import ServerSettings

pytestmark = pytest.mark.anyio

KB = 1000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Process:
    """A process holding the plan's memory and a model of ``model`` bytes while referenced."""

    def __init__(self, model: int) -> None:
        self.model = model
        self.cached = True
        self.in_use = True
        self.referenced = True

    def resident_weights(self, device: Device) -> int:
        return self.model if self.cached else 0

    def evict_idle(self, device: Device) -> int:
        if self.in_use or not self.cached:
            return 0
        self.cached = False
        return self.model

    def memory(self) -> int:
        return self.model if self.referenced else 0


async def test_a_waiter_is_placed_once_the_evicted_weights_have_left_the_process() -> None:
    settings = ServerSettings(  # type: ignore[call-arg]
        _env_file=None, framework_reserve_bytes=0, b_min=1, adaptation_window_s=0.0
    )
    scheduler = DeviceScheduler(Device("cpu", 100 * KB), settings, Metrics())
    process = _Process(model=60 * KB)
    scheduler.resident_weights = process.resident_weights
    scheduler.evict_idle = process.evict_idle
    scheduler.process_memory = process.memory
    # A request ran the cached 60 kB model; the next needs 80 kB: only the eviction places it.
    running = await scheduler.acquire(Demand("ran", KB, 0, 1, 1, 0.0))
    waiting = asyncio.create_task(scheduler.acquire(Demand("next", KB, 0, 80, 80, 1.0)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()

    process.in_use = False
    scheduler.release(running)  # the round evicts the model, still referenced by "ran"
    for _ in range(20):
        await asyncio.sleep(0)
    assert not process.cached and not waiting.done()
    process.referenced = False  # "ran" has dropped it: the next look measures it gone
    got = await asyncio.wait_for(waiting, 10)
    assert got.batch_size == 80


async def test_a_request_is_not_refused_for_evicted_weights_that_only_garbage_holds() -> None:
    settings = ServerSettings(  # type: ignore[call-arg]
        _env_file=None, framework_reserve_bytes=0, b_min=1, adaptation_window_s=0.0
    )
    scheduler = DeviceScheduler(Device("cpu", 100 * KB), settings, Metrics())
    process = _Process(model=60 * KB)
    process.in_use = False
    scheduler.resident_weights = process.resident_weights
    scheduler.evict_idle = process.evict_idle
    scheduler.process_memory = process.memory
    collections = []

    def reclaim() -> int:
        # The evicted model's request has let go: a collection frees what its cycles held.
        collections.append(process.referenced)
        process.referenced = False
        return process.model

    scheduler.reclaim = reclaim
    process.evict_idle(scheduler.device)  # by an earlier round; resident until collected
    # 80 kB fit once the 60 kB are collected, not beside them: no 507.
    got = await asyncio.wait_for(scheduler.acquire(Demand("next", KB, 0, 80, 80, 1.0)), 10)
    assert got.batch_size == 80 and collections == [True]
