"""Async unit tests of ``DeviceScheduler``: rounds, windows, releases, limits, timeouts.

The scheduler runs on a real event loop with the real ``Metrics``; only the wait window is
replaced, by a gate the test opens, so "the round waits for the window" is checked without
any timing assumption.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from hapi_core import InsufficientMemoryError, QueueFullError, RequestTimeoutError, solve
from hapi_core import adaptation as adaptation_module
from hapi_core.adaptation import DeviceScheduler, Reservation
from hapi_core.devices import Device
from hapi_core.metrics import Metrics
from hapi_core.solver import Demand
from hapi_server import ServerSettings

pytestmark = pytest.mark.anyio

KB = 1000
_arrivals = iter(range(1, 10**9))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def settings(**overrides: Any) -> ServerSettings:
    values: dict[str, Any] = {
        "framework_reserve_bytes": 0,
        "adaptation_window_s": 0.0,
        "b_min": 1,
        "request_timeout_s": 60.0,
    }
    values.update(overrides)
    return ServerSettings(_env_file=None, **values)  # type: ignore[call-arg]


def scheduler(
    total: int = 1000 * KB, metrics: Metrics | None = None, name: str = "cpu", **overrides: Any
) -> DeviceScheduler:
    return DeviceScheduler(Device(name, total), settings(**overrides), metrics or Metrics())


def demand(rid: str, d: int = KB, b_min: int = 1, b_max: int = 100) -> Demand:
    # Arrival order is the order demands are made in the test.
    return Demand(rid, d, 0, b_min, b_max, float(next(_arrivals)))


def sample(s: DeviceScheduler, name: str) -> float | None:
    return s.metrics.registry.get_sample_value(name, {"device": s.device.name})


async def settle() -> None:
    """Let every ready callback and task run (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


class WindowGate:
    """Stands in for ``asyncio`` inside ``hapi_core.adaptation``: the window waits for ``open``."""

    def __init__(self) -> None:
        self.windows: list[float] = []
        self._open = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.windows.append(delay)
        await self._open.wait()

    def open(self) -> None:
        self._open.set()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[WindowGate]:
    g = WindowGate()
    monkeypatch.setattr(adaptation_module, "asyncio", g)
    yield g
    g.open()


async def test_round_waits_for_the_window_then_plans_all_waiting_together(
    gate: WindowGate,
) -> None:
    s = scheduler(total=300 * KB, adaptation_window_s=0.25)
    demands = [demand(f"r{i}", b_min=10, b_max=1000) for i in range(3)]
    first = asyncio.create_task(s.acquire(demands[0]))
    await settle()
    assert gate.windows == [0.25]  # the round started and is inside its window
    assert not first.done() and sample(s, "hapi_queue_depth") == 1
    rest = [asyncio.create_task(s.acquire(d)) for d in demands[1:]]
    await settle()
    assert gate.windows == [0.25], "a second round started instead of joining the first"
    assert not any(t.done() for t in [first, *rest])
    assert sample(s, "hapi_queue_depth") == 3

    gate.open()
    reservations: list[Reservation] = await asyncio.gather(first, *rest)
    expected = solve(demands, 300 * KB)
    assert {r.request_id: r.batch_size for r in reservations} == expected.batches
    assert [r.batch_size for r in reservations] == [100, 100, 100]
    assert sample(s, "hapi_adaptation_decision_seconds_count") == 1  # one decision for all three
    assert sample(s, "hapi_queue_depth") == 0
    assert sample(s, "hapi_planned_memory_bytes") == 300 * KB
    assert s.free_bytes() == 0


async def test_release_plans_the_deferred_request() -> None:
    s = scheduler(total=100 * KB)
    a = await s.acquire(demand("a", b_min=100, b_max=100))
    b_task = asyncio.create_task(s.acquire(demand("b", b_min=50, b_max=80)))
    await settle()
    assert not b_task.done() and s.load == 2 and sample(s, "hapi_queue_depth") == 1
    s.release(a)
    b = await asyncio.wait_for(b_task, 10)
    assert b.batch_size == 80 and s.load == 1
    assert s.free_bytes() == 20 * KB
    s.release(b)
    s.release(b)  # idempotent
    assert s.free_bytes() == 100 * KB and sample(s, "hapi_planned_memory_bytes") == 0
    assert sample(s, "hapi_planned_memory_peak_bytes") == 100 * KB


async def test_an_older_waiter_goes_first_when_memory_frees() -> None:
    s = scheduler(total=120 * KB)
    holder = await s.acquire(demand("holder", b_min=60, b_max=60))
    old = asyncio.create_task(s.acquire(demand("old", b_min=70, b_max=70)))
    await settle()
    # "new" would fit in the 60 kB that are free, but not in the 50 kB that "old" leaves once
    # the holder ends: "old" waits longer and is served first. "tiny" fits in those 50 kB (the
    # fairness rule's slack): it runs at once, and "old" never waits for it.
    new = asyncio.create_task(s.acquire(demand("new", b_min=55, b_max=55)))
    tiny = asyncio.create_task(s.acquire(demand("tiny", b_min=10, b_max=10)))
    await settle()
    assert not old.done() and not new.done() and tiny.result().batch_size == 10
    s.release(holder)
    got_old = await asyncio.wait_for(old, 10)
    assert not new.done()
    s.release(tiny.result())
    s.release(got_old)
    got_new = await asyncio.wait_for(new, 10)
    assert (got_old.batch_size, got_new.batch_size) == (70, 55)


async def test_queue_full_is_503_with_retry_after() -> None:
    s = scheduler(total=100 * KB, queue_limit=1, retry_after_s=7)
    a = await s.acquire(demand("a", b_min=100, b_max=100))
    b_task = asyncio.create_task(s.acquire(demand("b", b_min=10)))
    await settle()
    with pytest.raises(QueueFullError) as info:
        await s.acquire(demand("c", b_min=10))
    assert info.value.status == 503 and info.value.headers == {"Retry-After": "7"}
    assert "queue_limit" in info.value.detail
    assert s.load == 2  # the refused request left nothing behind
    s.release(a)
    await asyncio.wait_for(b_task, 10)


async def test_infeasible_alone_is_507_with_the_numbers() -> None:
    s = scheduler(total=100 * KB, framework_reserve_bytes=10 * KB)
    with pytest.raises(InsufficientMemoryError) as info:
        await s.acquire(demand("huge", d=2 * KB, b_min=50, b_max=60))
    assert info.value.status == 507
    assert "100000 bytes" in info.value.detail  # 50 x 2 kB needed
    assert "90000 bytes" in info.value.detail  # total minus the framework reserve
    assert s.load == 0 and sample(s, "hapi_queue_depth") in (None, 0)
    # The capacity is not a plan: exactly the capacity still fits.
    ok = await s.acquire(demand("fits", d=KB, b_min=90, b_max=90))
    assert ok.batch_size == 90


async def test_weights_in_use_count_against_feasibility() -> None:
    s = scheduler(total=100 * KB)
    with pytest.raises(InsufficientMemoryError) as info:
        await s.acquire(demand("x", b_min=30, b_max=30), pinned_bytes=80 * KB)
    assert "80000" in info.value.detail and s.load == 0
    ok = await s.acquire(demand("y", b_min=20, b_max=20), pinned_bytes=80 * KB)
    assert ok.batch_size == 20


async def test_timeout_is_504_and_leaks_nothing() -> None:
    s = scheduler(total=100 * KB, request_timeout_s=0.05)
    a = await s.acquire(demand("a", b_min=100, b_max=100))
    with pytest.raises(RequestTimeoutError) as info:
        await s.acquire(demand("b", b_min=10))
    assert info.value.status == 504
    assert s.load == 1 and sample(s, "hapi_queue_depth") == 0
    s.release(a)
    await settle()
    assert s.load == 0 and s.free_bytes() == 100 * KB
    assert sample(s, "hapi_planned_memory_bytes") == 0
    # The scheduler still plans afterwards.
    c = await s.acquire(demand("c", b_min=10, b_max=100))
    assert c.batch_size == 100


async def test_cancelled_waiter_leaks_nothing() -> None:
    s = scheduler(total=100 * KB)
    a = await s.acquire(demand("a", b_min=100, b_max=100))
    waiting = asyncio.create_task(s.acquire(demand("b", b_min=10)))
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert s.load == 1 and sample(s, "hapi_queue_depth") == 0
    s.release(a)
    await settle()
    assert s.load == 0 and s.free_bytes() == 100 * KB


async def test_two_devices_plan_independently() -> None:
    metrics = Metrics()
    one = scheduler(total=100 * KB, metrics=metrics, name="cuda:0")
    two = scheduler(total=100 * KB, metrics=metrics, name="cuda:1")
    full = await one.acquire(demand("a", b_min=100, b_max=100))
    blocked = asyncio.create_task(one.acquire(demand("b", b_min=10)))
    await settle()
    # Device one is full and has a waiter; device two plans at once, and its b_max fits.
    other = await asyncio.wait_for(two.acquire(demand("c", b_min=10, b_max=100)), 10)
    assert other.batch_size == 100 and other.device.name == "cuda:1"
    assert not blocked.done()
    assert sample(one, "hapi_queue_depth") == 1 and sample(two, "hapi_queue_depth") == 0
    assert sample(one, "hapi_planned_memory_bytes") == 100 * KB
    assert sample(two, "hapi_planned_memory_bytes") == 100 * KB
    two.release(other)
    await settle()
    assert not blocked.done(), "a release on another device must not plan this one"
    one.release(full)
    assert (await asyncio.wait_for(blocked, 10)).batch_size == 100


async def test_without_adaptation_every_request_runs_at_b_max() -> None:
    s = scheduler(total=100 * KB, adaptation=False)
    got = [await s.acquire(demand(f"r{i}", b_min=10, b_max=90)) for i in range(3)]
    assert [r.batch_size for r in got] == [90, 90, 90]
    # Nothing checked it: the plan is three times over the device.
    assert sample(s, "hapi_planned_memory_bytes") == 270 * KB


# --- Head-of-line: a head waiting for weights that a request behind it pins ----------------------


class FakeWeights:
    """The weights cache as the scheduler sees it: one resident model and who pins it."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.users = 0
        self.resident = True

    def resident_bytes(self, _device: Device) -> int:
        return self.nbytes if self.resident else 0

    def evict_idle(self, _device: Device) -> int:
        if self.resident and self.users == 0:
            self.resident = False
            return self.nbytes
        return 0


async def test_a_head_blocked_by_weights_pinned_behind_it_does_not_block_the_queue() -> None:
    s = scheduler(total=100 * KB)
    cache = FakeWeights(60 * KB)
    s.resident_weights, s.evict_idle = cache.resident_bytes, cache.evict_idle
    # A cached 60 kB model is pinned by a request that reads its shard (it queues later).
    cache.users = 1
    large = asyncio.create_task(s.acquire(demand("large", b_min=50, b_max=50)))
    await settle()
    # 40 kB are free; "large" needs 50 and nothing runs that could free them.
    small = asyncio.create_task(s.acquire(demand("small-other-user", b_min=5, b_max=5)))
    pinner = asyncio.create_task(
        s.acquire(demand("pinner", b_min=10, b_max=10), pinned_bytes=60 * KB)
    )
    await settle()
    # Before: "large" was at the head, everyone waited until request_timeout (504 for all).
    assert small.done() and pinner.done() and not large.done()
    assert small.result().batch_size == 5 and pinner.result().batch_size == 10
    # Once they end, the pin is gone, the model is evicted and the head is placed.
    s.release(small.result())
    await settle()
    assert not large.done()  # something runs: its pin is not released yet
    cache.users = 0
    s.release(pinner.result())
    got = await asyncio.wait_for(large, 10)
    assert got.batch_size == 50 and not cache.resident


# --- The process's own resident memory (CPU) ---------------------------------------------------


class FakeProcess:
    """This process's resident bytes, as /proc/self/statm would say."""

    def __init__(self, rss: int) -> None:
        self.rss = rss

    def __call__(self) -> int:
        return self.rss


async def test_resident_memory_beyond_the_plan_counts_on_a_cpu() -> None:
    s = scheduler(total=100 * KB, framework_reserve_bytes=10 * KB)
    process = FakeProcess(40 * KB)
    s.process_memory = process
    # 40 kB resident, 10 kB of them the reserve: 30 kB outside the plan.
    assert s.unplanned_bytes() == 30 * KB and s.free_bytes() == 60 * KB
    got = await s.acquire(demand("a", b_min=10, b_max=100))
    assert got.batch_size == 60  # before: 90, 30 kB over the budget
    # Planned memory in use is not counted twice: RSS grows by what the plan holds.
    process.rss += 60 * KB
    assert s.unplanned_bytes() == 30 * KB and s.free_bytes() == 0
    # A request that cannot fit beside what the process holds is 507 at once.
    s.release(got)
    with pytest.raises(InsufficientMemoryError) as info:
        await s.acquire(demand("b", b_min=70, b_max=70))
    assert "outside the plan" in info.value.detail


async def test_a_running_request_s_unused_plan_hides_no_memory_outside_the_plan() -> None:
    s = scheduler(total=100 * KB, framework_reserve_bytes=10 * KB)
    process = FakeProcess(40 * KB)
    s.process_memory = process
    first = await s.acquire(demand("first", b_min=30, b_max=30))
    # Admitted, "first" holds nothing of its 30 kB yet (its read or its first batch is to
    # come): the process's 40 kB are still the reserve and 30 kB outside the plan.
    assert s.unplanned_bytes() == 30 * KB and s.free_bytes() == 30 * KB
    second = await s.acquire(demand("second", b_min=10, b_max=100))
    # Before: 60 kB (40 kB less the reserve and first's plan: 0 kB outside), and once both
    # held their plans the process had 130 kB of the 100.
    assert second.batch_size == 30
    process.rss += 60 * KB  # both hold their plans: the budget is met
    assert s.unplanned_bytes() == 30 * KB and s.free_bytes() == 0
    # Memory outside the plan that grows while requests run still counts at once.
    process.rss += 5 * KB
    assert s.unplanned_bytes() == 35 * KB
    # Once nothing runs, the measurement is exact again.
    s.release(first)
    s.release(second)
    process.rss = 20 * KB
    assert s.unplanned_bytes() == 10 * KB and s.free_bytes() == 80 * KB


async def test_a_waiter_that_can_never_fit_is_507_not_504() -> None:
    s = scheduler(total=100 * KB)
    process = FakeProcess(0)
    s.process_memory = process
    holder = await s.acquire(demand("holder", b_min=60, b_max=60))
    process.rss = 60 * KB
    large = asyncio.create_task(s.acquire(demand("large", b_min=50, b_max=50)))
    small = asyncio.create_task(s.acquire(demand("small", b_min=5, b_max=5)))
    await settle()
    # "small" fits in what "large" leaves even once the holder ends: it runs at once.
    got = small.result()
    assert got.batch_size == 5 and not large.done()
    # The holder ends but its memory stays with the process (the allocator keeps it): 60 kB
    # outside the plan, and "small" still runs: "large" waits.
    s.release(holder)
    await settle()
    assert not large.done()
    # Nothing runs any more and "large" still does not fit: 507, not a 504 after the timeout.
    s.release(got)
    await settle()
    assert large.done() and isinstance(large.exception(), InsufficientMemoryError)
    assert "outside the plan" in large.exception().detail  # type: ignore[union-attr]
    assert sample(s, "hapi_queue_depth") == 0 and s.load == 0
