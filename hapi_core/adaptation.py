"""The batch-adaptation scheduler of one device: admission, planning rounds, reservations.

A round runs when an unplanned request waits and memory is free: after a short window that
gathers requests arriving together, :func:`hapi_core.solver.solve` picks every waiting
request's COS batch size against the free memory (total - framework reserve - running requests
- resident weights - memory outside the plan: other processes on a GPU, this process's
resident memory beyond what is planned on a CPU). Deferred requests wait for the next round,
which the end of any running request triggers.

Fairness (the solver's rule, :mod:`hapi_core.solver`): first come, first served while the
oldest waiter (the head) can be placed once the running requests end; when it waits for memory
that no running request frees (weights pinned by the requests behind it, memory outside the
plan), the requests behind it that fit are planned meanwhile, so the queue moves whenever some
request fits. A head that cannot fit even with nothing else running or waiting (its own pinned
weights and the memory outside the plan taken off the capacity) is refused with a 507 at the
next round, never left to time out.

The scheduler itself never blocks and is used from one thread: the HAPI server's event loop, or
the Swift proxy's eventlet hub. How a request waits for its round is the caller's: the server
awaits :meth:`DeviceScheduler.acquire`; the filter's in-proxy execution waits on an eventlet
event inside :meth:`DeviceScheduler.waiting`. Rounds are started through :class:`Timers`, the
one thing each host supplies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from .devices import Device, external_used_bytes
from .errors import HapiCoreError, InsufficientMemoryError, QueueFullError, RequestTimeoutError
from .host_memory import HOST_MEMORY, HostMemoryProbe
from .metrics import Metrics
from .settings import CoreSettings
from .solver import (
    Demand,
    InfeasibleRequestError,
    Plan,
    Releases,
    check_feasible_alone,
    effective_b_min,
    solve,
)

log = logging.getLogger(__name__)


@dataclass
class Reservation:
    request_id: str
    device: Device
    batch_size: int
    planned_bytes: int
    model_bytes: int
    released: bool = False
    bytes_per_sample: int = 0
    arrival: float = 0.0
    """When the request arrived (its demand's): the fairness rule counts on a running
    request's memory only for the waiters that arrived after it."""


class Timers(Protocol):
    """Runs ``callback`` after ``delay`` seconds on the scheduler's own thread."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> None: ...


class AsyncioTimers:
    """:class:`Timers` on the running asyncio loop (the HAPI server's)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        task = asyncio.get_running_loop().create_task(self._after(delay, callback))
        self._tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _after(delay: float, callback: Callable[[], None]) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        callback()


@dataclass
class Ticket:
    """A request waiting for its COS batch: ``on_ready`` is called once it is planned."""

    demand: Demand
    on_ready: Callable[[], None]
    refresh: Callable[[Demand], Demand] | None = None
    reservation: Reservation | None = None
    pinned_bytes: int = 0
    """Resident weights the request keeps pinned while it waits (see :meth:`submit`)."""
    refusal: HapiCoreError | None = None
    """Set (and ``on_ready`` called) when a round finds the request can never be placed."""


@dataclass
class DeviceScheduler:
    device: Device
    settings: CoreSettings
    metrics: Metrics
    timers: Timers = field(default_factory=AsyncioTimers)
    resident_weights: Callable[[Device], int] | None = None
    """Set by the weights cache: bytes of weights resident on a device."""
    _waiting: dict[str, Ticket] = field(default_factory=dict)
    _running: dict[str, Reservation] = field(default_factory=dict)
    _round_due: bool = False
    _planned_peak: int = 0
    evict_idle: Callable[[Device], int] | None = None
    """Set by the weights cache: drop idle weights of a device, return the bytes freed."""
    reclaim: Callable[[], int] | None = None
    """Set by the weights cache: free dropped weights that only garbage still holds, return
    the bytes freed (a full garbage collection; called only before a 507)."""
    host_memory: HostMemoryProbe = field(default_factory=lambda: HOST_MEMORY)
    """Told of every admission and release: it measures a batch only while its request runs
    alone in the process."""
    process_memory: Callable[[], int] | None = None
    """This process's resident bytes, for a CPU device (None: not counted). What it holds
    beyond the reserve, the planned requests and the resident weights is occupied too."""
    _outside_idle: int = 0
    """Memory outside the plan (CPU) as last measured with no request admitted: the floor of
    :meth:`unplanned_bytes` while requests run."""

    @property
    def load(self) -> int:
        return len(self._waiting) + len(self._running)

    @property
    def capacity_bytes(self) -> int:
        """What requests may ever use here: total minus the framework reserve."""
        return max(0, self.device.total_bytes - self.settings.framework_reserve_bytes)

    def occupied_bytes(self) -> int:
        planned = self.settings.framework_reserve_bytes + self._planned() + self._resident()
        return planned + self.unplanned_bytes(planned)

    def unplanned_bytes(self, planned: int | None = None) -> int:
        """Memory in use that no plan accounts for: other processes' on a GPU (NVML); on a CPU,
        this process's memory outside the plan (:meth:`_measured_outside`: what earlier
        requests left behind in the allocator, the host itself), and while requests run at
        least as much as was measured when none did.

        While requests run, the process's resident memory less their plans under-reads: a
        request holds less than its plan before its first batch and between batches, and that
        slack hides as much memory outside the plan. Issue 27: the ResNet18 576 px request
        admitted right after another was planned beside 453 MiB outside the plan where 624
        MiB had been measured a moment before with nothing running, so both requests' 171 MiB
        were admitted over the budget. With nothing admitted the measurement is exact, and it
        is kept as the floor until the next such moment."""
        measured = self._measured_outside(planned)
        if self.device.is_cuda:
            return measured
        if not self._running:
            self._outside_idle = measured
            return measured
        return max(measured, self._outside_idle)

    def _measured_outside(self, planned: int | None = None) -> int:
        """Memory outside the plan as measured now: other processes' on a GPU; on a CPU, this
        process's resident memory beyond the reserve, the planned requests and the resident
        weights (``planned``), so nothing is counted twice, which is at most the memory outside
        the plan (a running request may hold less than its plan)."""
        if self.device.is_cuda:
            return external_used_bytes(self.device)
        if self.process_memory is None:
            return 0
        if planned is None:
            planned = self.settings.framework_reserve_bytes + self._planned() + self._resident()
        return max(0, self.process_memory() - planned)

    def _planned(self) -> int:
        return sum(r.planned_bytes for r in self._running.values())

    def free_bytes(self) -> int:
        return max(0, self.device.total_bytes - self.occupied_bytes())

    async def acquire(
        self,
        demand: Demand,
        pinned_bytes: int = 0,
        refresh: Callable[[Demand], Demand] | None = None,
    ) -> Reservation:
        """Wait for a planned COS batch size; raise 507 / 503 / 504 errors as the case may be
        (see :meth:`submit`). For a caller on an asyncio loop."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        with self.waiting(demand, pinned_bytes, refresh, on_ready=wake) as ticket:
            try:
                await asyncio.wait_for(asyncio.shield(ready), self.settings.request_timeout_s)
            except TimeoutError as exc:
                raise self.timed_out(ticket) from exc
        assert ticket.reservation is not None
        return ticket.reservation

    @contextmanager
    def waiting(
        self,
        demand: Demand,
        pinned_bytes: int = 0,
        refresh: Callable[[Demand], Demand] | None = None,
        *,
        on_ready: Callable[[], None],
    ) -> Iterator[Ticket]:
        """:meth:`submit` ``demand``; the body waits until ``on_ready`` was called (or raises
        :meth:`timed_out`). The ticket is settled on the way out: served when the body ended
        normally, released when it raised (a timeout, a cancellation). ``on_ready`` may have
        been called before the body starts (always so without adaptation)."""
        ticket = self.submit(demand, pinned_bytes, refresh, on_ready=on_ready)
        try:
            yield ticket
        except BaseException:
            self.settle(ticket, served=False)
            raise
        if ticket.refusal is not None:
            self.settle(ticket, served=False)
            raise ticket.refusal
        self.settle(ticket, served=True)

    def submit(
        self,
        demand: Demand,
        pinned_bytes: int = 0,
        refresh: Callable[[Demand], Demand] | None = None,
        *,
        on_ready: Callable[[], None],
    ) -> Ticket:
        """Queue ``demand`` for a planning round (507 if it can never fit, 503 if the queue is
        full); ``on_ready`` is called once a round admitted it. Without adaptation the ticket
        comes back admitted at ``b_max``. Every ticket ends with :meth:`settle`.

        ``pinned_bytes`` is memory the request itself keeps occupied while it waits (its model's
        resident weights): it can never be freed for the request, so it counts against
        feasibility, else such a request would wait for memory that never comes. ``refresh``
        is called on the demand before every planning round while it waits: a request that
        planned to load its model asks for those bytes no more once another request has made
        that model resident (the cache counts it then).
        """
        ticket = Ticket(demand, on_ready, refresh, pinned_bytes=pinned_bytes)
        if not self.settings.adaptation:
            ticket.reservation = self._admit(demand, demand.b_max)
            on_ready()
            return ticket
        # Weights the request holds (pinned, resident) or will load (its model_bytes) are
        # never freed for it: they come off the capacity, and the samples must fit the rest.
        self._check_placeable(demand, pinned_bytes)
        if len(self._waiting) >= self.settings.queue_limit:
            raise QueueFullError(
                f"{self.device.name}: {len(self._waiting)} requests already wait (queue_limit)",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            )
        self._waiting[demand.request_id] = ticket
        self._publish()
        self._kick()
        return ticket

    def _check_placeable(self, demand: Demand, pinned_bytes: int) -> None:
        """507 unless ``demand`` fits the capacity less its own weights and the memory outside
        the plan (measured now: what nothing here will free). On a CPU the measurement alone,
        without the floor that planning keeps: a refusal only for what surely is outside."""
        weights = pinned_bytes + demand.model_bytes
        alone = dataclasses.replace(demand, model_bytes=0)
        outside = self._measured_outside()
        try:
            try:
                check_feasible_alone(alone, max(0, self.capacity_bytes - weights - outside))
            except InfeasibleRequestError:
                # Evicted weights whose request has let go are garbage in reference cycles
                # (see hapi_core.weights_cache), resident until collected: collect before a
                # refusal, which must count only what surely stays.
                if self.reclaim is None or self.reclaim() == 0:
                    raise
                outside = self._measured_outside()
                check_feasible_alone(alone, max(0, self.capacity_bytes - weights - outside))
        except InfeasibleRequestError as exc:
            held = [
                f"its model's weights hold {weights}" if weights else "",
                f"{outside} are in use outside the plan" if outside else "",
            ]
            why = "; ".join(h for h in held if h)
            detail = f" ({why} of the device's {self.capacity_bytes} usable bytes)" if why else ""
            raise InsufficientMemoryError(
                f"{exc}{detail}; lower b_max or the split index, or raise the device budget"
            ) from exc

    def settle(self, ticket: Ticket, *, served: bool) -> Reservation | None:
        """End ``ticket``'s wait: its reservation when ``served``; otherwise (timed out,
        cancelled) a reservation a round made meanwhile is released and None comes back."""
        if self._waiting.pop(ticket.demand.request_id, None) is not None:
            self._publish()
        if served:
            return ticket.reservation
        if ticket.reservation is not None:
            self.release(ticket.reservation)
        return None

    def timed_out(self, ticket: Ticket) -> RequestTimeoutError:
        """The 504 of a request that waited ``request_timeout_s`` for memory."""
        return RequestTimeoutError(
            f"no memory for request {ticket.demand.request_id} within "
            f"{self.settings.request_timeout_s} s"
        )

    def _admit(self, demand: Demand, batch: int) -> Reservation:
        reservation = Reservation(
            demand.request_id,
            self.device,
            batch,
            demand.footprint(batch),
            demand.model_bytes,
            bytes_per_sample=demand.bytes_per_sample,
            arrival=demand.arrival,
        )
        self._running[demand.request_id] = reservation
        self.host_memory.admitted()
        self.metrics.cos_batch_size.labels(self.device.name).observe(batch)
        self._publish()
        return reservation

    def release(self, reservation: Reservation) -> None:
        if reservation.released:
            return
        reservation.released = True
        if self._running.pop(reservation.request_id, None) is not None:
            self.host_memory.released()
        self._publish()
        self._kick()

    def shrink(self, reservation: Reservation, batch: int) -> None:
        """The request needs COS batches of at most ``batch`` samples (its shard has no more):
        the samples' memory beyond them is given back to whoever waits."""
        batch = max(1, batch)
        if reservation.released or batch >= reservation.batch_size:
            return
        reservation.planned_bytes -= (reservation.batch_size - batch) * reservation.bytes_per_sample
        reservation.batch_size = batch
        self._publish()
        self._kick()

    def hand_over_model_bytes(self, reservation: Reservation, nbytes: int) -> None:
        """``nbytes`` of the request's model memory is now counted by the weights cache (the
        model became resident) or freed (the load's transient copies): stop counting it twice."""
        amount = min(nbytes, reservation.model_bytes)
        if amount > 0 and not reservation.released:
            reservation.planned_bytes -= amount
            reservation.model_bytes -= amount
            self._publish()
            # Memory came free for others: plan whoever waits.
            self._kick()

    def _kick(self) -> None:
        if not self._round_due and any(t.reservation is None for t in self._waiting.values()):
            self._round_due = True
            # The window gathers requests that arrive together into one decision (the thesis'
            # leader round).
            self.timers.call_later(self.settings.adaptation_window_s, self._plan_round)

    def _plan_round(self) -> None:
        self._round_due = False
        pending = [t for t in self._waiting.values() if t.reservation is None]
        if pending:
            for t in pending:
                if t.refresh is not None:
                    before = t.demand.model_bytes
                    t.demand = t.refresh(t.demand)
                    # A load no longer planned is a resident model now pinned for the request.
                    t.pinned_bytes += max(0, before - t.demand.model_bytes)
            start = time.perf_counter()
            plan = self._solve(pending)
            decision = time.perf_counter() - start
            evicted = False
            if plan.deferred and self.evict_idle is not None and self.evict_idle(self.device) > 0:
                evicted = True
                start = time.perf_counter()
                plan = self._solve(pending)
                decision = time.perf_counter() - start
            self.metrics.adaptation_seconds.labels(self.device.name).observe(decision)
            for t in pending:
                batch = plan.batches.get(t.demand.request_id)
                if batch is not None:
                    t.reservation = self._admit(t.demand, batch)
                    t.on_ready()
            if plan.backfilled:
                log.info(
                    "%s: %s waits for memory no running request frees; planned behind it: %s",
                    self.device.name,
                    plan.head,
                    ", ".join(plan.backfilled),
                )
            if plan.deferred:
                log.info(
                    "%s: %d request(s) deferred to the next round (free %d bytes): %s",
                    self.device.name,
                    len(plan.deferred),
                    plan.free_bytes,
                    ", ".join(plan.deferred),
                )
            if not self._running and not evicted:
                # Not in a round that evicted: the weights leave the process only once the
                # request that last ran them has dropped them, after its release, so they
                # still counted as memory outside the plan (issue 27: a ViT-L/16 refused 507
                # once the ConvNeXt-L before it ended). The next look (below) measures again.
                self._refuse_unplaceable(pending)
        if not self._running and any(t.reservation is None for t in self._waiting.values()):
            # Nothing running means no release will come: only memory outside the plan can be
            # in the way, so look again shortly.
            self.timers.call_later(0.05, self._kick)

    def _solve(self, pending: list[Ticket]) -> Plan:
        # What ending the running requests gives back: their planned memory and the weights
        # that no waiting request pins (a weight pinned by two waiters counts twice, which only
        # makes backfilling come sooner).
        pins = sum(t.pinned_bytes for t in self._waiting.values())
        releases = Releases(
            idle_bytes=max(0, self._resident() - pins),
            running=tuple((r.arrival, r.planned_bytes) for r in self._running.values()),
        )
        return solve([t.demand for t in pending], self.free_bytes(), releases)

    def _refuse_unplaceable(self, pending: list[Ticket]) -> None:
        """With nothing running, a waiter that does not fit the capacity less its own weights
        and the memory outside the plan never will: 507 now rather than a 504 later."""
        for t in pending:
            if t.reservation is not None or t.refusal is not None:
                continue
            try:
                self._check_placeable(t.demand, t.pinned_bytes)
            except InsufficientMemoryError as exc:
                t.refusal = exc
                self._waiting.pop(t.demand.request_id, None)
                self._publish()
                t.on_ready()

    def _publish(self) -> None:
        name = self.device.name
        planned = self._planned()
        resident = self._resident()
        self._planned_peak = max(self._planned_peak, planned + resident)
        self.metrics.queue_depth.labels(name).set(len(self._waiting))
        self.metrics.planned_bytes.labels(name).set(planned)
        self.metrics.planned_peak_bytes.labels(name).set(self._planned_peak)
        self.metrics.resident_weights_bytes.labels(name).set(resident)

    def _resident(self) -> int:
        return self.resident_weights(self.device) if self.resident_weights is not None else 0


_ids = itertools.count()


def new_request_id(prefix: str = "r") -> str:
    return f"{prefix}{next(_ids)}-{int(time.time() * 1000) % 10**8}"


def make_demand(
    request_id: str,
    bytes_per_sample: int,
    model_bytes: int,
    b_min: int,
    b_max: int,
    input_bytes: int = 0,
) -> Demand:
    return Demand(
        request_id=request_id,
        bytes_per_sample=max(1, bytes_per_sample),
        model_bytes=max(0, model_bytes),
        b_min=effective_b_min(b_min, b_max),
        b_max=b_max,
        arrival=time.monotonic(),
        input_bytes=max(0, input_bytes),
    )
