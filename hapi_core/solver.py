"""Batch adaptation: the COS batch size of every waiting request on one device (thesis eq. 5.1).

Per device, with ``d_r`` = bytes per sample of request r (input plus peak activations of the
head it runs) and ``m_r`` = bytes of its model that are not already resident::

    maximise   sum_r (b_r * d_r + m_r)
    subject to sum_r (b_r * d_r + m_r) <= free,   b_min_r <= b_r <= b_max_r,  b_r integer

(the parenthesisation of the thesis' eq. 5.1 read as R3 of ``docs/references.md``). The objective is the
constraint's left side, so any plan that fills the free memory, or gives everyone b_max, is
optimal. The closed form below does exactly that in O(n log n), where the thesis ran a MILP
solver (PuLP + CBC, about 25 ms):

1. Feasibility: the requests are taken in arrival order (ties: the smaller minimum footprint
   first) and the longest prefix whose ``sum_r (b_min_r * d_r + m_r)`` fits is planned. The
   first request that does not fit is the *head*. **Fairness rule:**

   * If the head could be placed once the requests already running end (its minimum
     footprint is at most ``free`` plus the memory those requests give back, ``reclaimable``),
     memory freed by finishing requests goes to the oldest waiter first: service is
     first-come first-served, and a request that waits only gets older. Later requests are
     planned now only into what the head can spare (*backfilling within the head's slack*):
     all that this round plans behind the head, at its COS batches, fits in ``free`` plus
     what the running requests that arrived before the head give back, less the head's
     minimum footprint. Those requests are then certain to end, so the head never waits for
     a request planned behind it, and it cannot starve behind later arrivals; a small request
     of another user no longer waits for a large one's slow reader (issue 27: a second user's
     ResNet18 waited 60 s behind a ViT-L/16 that waited for a pinned ConvNeXt-L).
   * Otherwise the head waits for memory that no running request will free (weights pinned by
     requests that wait behind it, memory outside the plan): later requests that fit in what
     is left are planned now, in arrival order (*backfilling*). The queue moves whenever some
     request fits, so a small request of another user is never timed out behind a large one
     that cannot be placed; the requests planned so run, end, and unpin what the head needs.
     Once something runs, the first case applies again and the head is first in line.

   ``reclaimable=None`` (the default) means that running requests may free anything and are
   all older than any waiter: pure first-come first-served. Taken-out requests wait for the
   next round.
2. Sharing: the memory left after everyone's b_min is water-filled in bytes: every request gets
   an equal byte share of the remainder, capped at b_max, and what a capped request cannot use is
   re-shared among the others. Byte-equal shares mean a request with heavy samples gets fewer
   extra samples, not more memory.
3. Integer rounding leaves less than one sample per request unused; a final pass adds single
   samples, in arrival order, while any still fits. The result is maximal: no request's batch
   can grow by one without exceeding the budget or its b_max.

The solver is pure (no torch, no I/O) so it is unit-tested and timed on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class InfeasibleRequestError(ValueError):
    """A request that does not fit even alone at its b_min on an empty device."""

    def __init__(self, request_id: str, needed: int, capacity: int) -> None:
        super().__init__(
            f"request {request_id} needs {needed} bytes at its minimum COS batch "
            f"but the device can offer at most {capacity} bytes"
        )
        self.request_id = request_id
        self.needed = needed
        self.capacity = capacity


@dataclass(frozen=True)
class Demand:
    """One waiting request as the solver sees it."""

    request_id: str
    bytes_per_sample: int
    model_bytes: int
    b_min: int
    b_max: int
    arrival: float
    input_bytes: int = 0
    """Bytes of stored objects the request holds while it runs (its shard or part, read only
    once this memory is planned): a constant term, like ``model_bytes``."""

    def __post_init__(self) -> None:
        if self.bytes_per_sample < 1:
            raise ValueError(f"{self.request_id}: bytes_per_sample must be >= 1")
        if self.model_bytes < 0 or self.input_bytes < 0:
            raise ValueError(f"{self.request_id}: model_bytes and input_bytes must be >= 0")
        if not 1 <= self.b_min <= self.b_max:
            raise ValueError(
                f"{self.request_id}: need 1 <= b_min <= b_max, got {self.b_min}, {self.b_max}"
            )

    def footprint(self, batch: int) -> int:
        return batch * self.bytes_per_sample + self.model_bytes + self.input_bytes


@dataclass(frozen=True)
class Releases:
    """What ending the running requests gives back, as the fairness rule reads it."""

    idle_bytes: int = 0
    """Freed whichever request ends: idle weights that no waiting request pins."""
    running: tuple[tuple[float, int], ...] = ()
    """Each running request's arrival and planned bytes."""

    def total(self) -> int:
        return self.idle_bytes + sum(nbytes for _, nbytes in self.running)

    def before(self, arrival: float) -> int:
        """What ending the running requests that arrived no later than ``arrival`` gives
        back (those planned behind a waiter, by backfilling, are not counted on for it)."""
        return self.idle_bytes + sum(nbytes for when, nbytes in self.running if when <= arrival)


@dataclass(frozen=True)
class Plan:
    batches: dict[str, int]
    """request id -> chosen COS batch size, for the requests that run now."""
    deferred: list[str]
    """request ids taken out by the fairness rule, to be planned in a later round."""
    planned_bytes: int
    free_bytes: int
    head: str | None = None
    """The oldest request left waiting (None: everyone was planned)."""
    backfilled: tuple[str, ...] = ()
    """Requests planned ahead of ``head`` because it waits for memory no running request
    frees (the fairness rule's second case)."""


def effective_b_min(b_min: int, b_max: int) -> int:
    """A request asking for less than the operator's b_min gets its own b_max as the minimum."""
    return min(b_min, b_max)


def solve(
    demands: Sequence[Demand],
    free_bytes: int,
    reclaimable_bytes: int | Releases | None = None,
) -> Plan:
    """Choose COS batch sizes for ``demands`` sharing ``free_bytes`` of one device.

    ``reclaimable_bytes``: what the requests already running give back when they end (None:
    unbounded, pure first-come first-served; a number: all of them older than any waiter);
    see the fairness rule in the module doc."""
    free = max(0, int(free_bytes))
    releases = (
        Releases(idle_bytes=max(0, reclaimable_bytes))
        if isinstance(reclaimable_bytes, int)
        else reclaimable_bytes
    )
    # Arrival order (ties: smaller minimum footprint first) is the order of service.
    order = sorted(demands, key=lambda d: (d.arrival, d.footprint(d.b_min)))
    prefix: list[Demand] = []
    need = 0
    for d in order:
        if need + d.footprint(d.b_min) > free:
            break
        prefix.append(d)
        need += d.footprint(d.b_min)
    rest = order[len(prefix) :]
    head = rest[0] if rest else None
    # What may be planned behind the head (the fairness rule): all that is free when no
    # release can place it, else only its slack.
    behind = 0
    if head is not None and releases is not None:
        head_need = head.footprint(head.b_min)
        if head_need > free + releases.total():
            behind = free - need
        else:
            behind = min(free - need, free + releases.before(head.arrival) - head_need)
    backfilled: list[Demand] = []
    taken = 0  # the backfilled requests' minimum footprints
    for d in rest[1:]:
        if taken + d.footprint(d.b_min) <= behind:
            backfilled.append(d)
            taken += d.footprint(d.b_min)
    planned_ids = {d.request_id for d in prefix + backfilled}
    # Latest arrival first, as the rule takes them out.
    deferred = [d.request_id for d in reversed(rest) if d.request_id not in planned_ids]
    head_id = head.request_id if head is not None else None
    ahead = tuple(d.request_id for d in backfilled)
    if not prefix and not backfilled:
        return Plan({}, deferred, 0, free, head_id, ahead)

    batches = {d.request_id: d.b_min for d in prefix + backfilled}
    spare = free - need - taken
    # The requests before the head grow first; those behind it within its slack only.
    spare -= _grow(prefix, batches, spare)
    _grow(backfilled, batches, min(spare, behind - taken))
    active = sorted(prefix + backfilled, key=lambda d: (d.arrival, d.footprint(d.b_min)))
    planned = sum(d.footprint(batches[d.request_id]) for d in active)
    return Plan(
        {d.request_id: batches[d.request_id] for d in active},
        deferred,
        planned,
        free,
        head_id,
        ahead,
    )


def _grow(group: Sequence[Demand], batches: dict[str, int], spare: int) -> int:
    """Grow ``group``'s batches (in ``batches``) within ``spare`` bytes; the bytes spent.

    The spare memory is water-filled in bytes: every request gets an equal byte share, capped
    at its b_max, and what a capped request cannot use is re-shared among the others. Integer
    rounding leaves less than one sample per request; single samples are then added, in
    arrival order, while any still fits, so no batch can grow by one more."""
    remaining = max(0, spare)
    growing = [d for d in group if d.b_max > batches[d.request_id]]
    while growing and remaining > 0:
        share = remaining // len(growing)
        if share == 0:
            break
        still: list[Demand] = []
        spent = 0
        for d in growing:
            room = d.b_max - batches[d.request_id]
            extra = min(room, share // d.bytes_per_sample)
            batches[d.request_id] += extra
            spent += extra * d.bytes_per_sample
            if extra < room and share // d.bytes_per_sample >= 1:
                still.append(d)
        remaining -= spent
        if spent == 0:
            break
        growing = [d for d in still if batches[d.request_id] < d.b_max]
    progressed = True
    while progressed and remaining > 0:
        progressed = False
        for d in group:
            if batches[d.request_id] < d.b_max and d.bytes_per_sample <= remaining:
                batches[d.request_id] += 1
                remaining -= d.bytes_per_sample
                progressed = True
    return max(0, spare) - max(0, remaining)


def check_feasible_alone(demand: Demand, capacity_bytes: int) -> None:
    """Raise :class:`InfeasibleRequestError` if ``demand`` cannot run even on an empty device."""
    needed = demand.footprint(demand.b_min)
    if needed > capacity_bytes:
        raise InfeasibleRequestError(demand.request_id, needed, capacity_bytes)
