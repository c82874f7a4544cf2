"""Turns at a CPU's cores for the heads' forward passes: as many at once as the cores hold.

A CPU host gives torch's intra-op threads all the cores decode leaves (:func:`split_threads`),
so one forward pass already keeps them busy, and a second one beside it only time-slices them:
both finish late, and together they cost more CPU time than one after the other (activations
evicting each other from the caches). Measured with ``hapi bench sweep --quick`` on a 2-core AMD
EPYC, the server on one core, one job of two 40-image shards requested at once: with both
requests' forward passes running together the server spent 3.4 CPU seconds and the job took
4.5 s; one after the other, 2.7 s and 3.3 s, and the first shard reached the client in half
the time, so its training overlapped the second shard's extraction.

So each forward pass (one COS batch) takes a turn, at most ``slots`` at once, and a freed turn
goes to the owner (the caller's account) served least recently, then to that owner's oldest
request: one tenant's many requests get the share of one tenant, and a job's first shard
finishes before its second. Whatever else a request does (reading, decoding, encoding) runs
beside the turns. A GPU runs its queued kernels in order anyway: no turns there.

The waiting threads are OS threads in both hosts (the server's workers, the proxy's
``tpool``); each waits on a lock of its own that the releasing thread hands over, so no green
primitive is ever contended across OS threads (see :mod:`hapi_core.locks`).
"""

from __future__ import annotations

import _thread
import functools
import itertools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

from .errors import RequestTimeoutError
from .locks import os_lock

__all__ = ["ForwardTurns", "turn_taker"]


@dataclass
class _Waiter:
    owner: str
    arrived: float
    order: int
    gate: _thread.LockType
    granted: bool = False


@dataclass
class ForwardTurns:
    """At most ``slots`` forward passes at once; a freed turn goes to the least recently
    served owner's oldest request (module doc)."""

    slots: int
    lock_factory: Callable[[], _thread.LockType] = os_lock
    _free: int = field(init=False)
    _waiting: list[_Waiter] = field(init=False, default_factory=list)
    _served: dict[str, int] = field(init=False, default_factory=dict)
    """Each owner's last turn, by a running count (round robin between owners)."""
    _count: itertools.count[int] = field(init=False, default_factory=itertools.count)
    _lock: _thread.LockType = field(init=False)

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1, not {self.slots}")
        self._free = self.slots
        self._lock = self.lock_factory()

    @property
    def waiting(self) -> int:
        """Forward passes waiting for a turn now."""
        with self._lock:
            return len(self._waiting)

    @contextmanager
    def turn(self, owner: str, arrived: float, timeout_s: float) -> Iterator[None]:
        """Hold a turn for the body: at once when one is free and nobody waits, else when the
        rule gives it; :class:`RequestTimeoutError` after ``timeout_s`` (a bound a healthy host
        never reaches: each turn is one COS batch's forward)."""
        self._acquire(owner, arrived, timeout_s)
        try:
            yield
        finally:
            self._release()

    def _acquire(self, owner: str, arrived: float, timeout_s: float) -> None:
        with self._lock:
            order = next(self._count)
            if self._free > 0 and not self._waiting:
                self._free -= 1
                self._served[owner] = order
                return
            waiter = _Waiter(owner, arrived, order, self.lock_factory())
            waiter.gate.acquire()  # held until a release hands the turn over
            self._waiting.append(waiter)
        if waiter.gate.acquire(timeout=max(0.0, timeout_s)):
            return
        with self._lock:
            if waiter.granted:  # handed over as the wait ended: the turn is ours
                return
            self._waiting.remove(waiter)
        raise RequestTimeoutError(
            f"waited {timeout_s:g} s for a turn at the CPU's cores (the forward passes ahead "
            "never ended)"
        )

    def _release(self) -> None:
        with self._lock:
            if not self._waiting:
                self._free += 1
                if self._free == self.slots:
                    self._served.clear()  # idle: no turn to share, no owner to remember
                return
            nxt = min(
                self._waiting, key=lambda w: (self._served.get(w.owner, -1), w.arrived, w.order)
            )
            self._waiting.remove(nxt)
            self._served[nxt.owner] = next(self._count)
            nxt.granted = True
            nxt.gate.release()


def turn_taker(
    turns: ForwardTurns | None, *, cuda: bool, owner: str, arrived: float, timeout_s: float
) -> Callable[[], AbstractContextManager[None]]:
    """What each forward pass of one request holds: a turn of ``turns`` on a CPU, nothing on a
    GPU or a host without turns (the engine's batches and a timing request's passes alike)."""
    if turns is None or cuda:
        return nullcontext
    return functools.partial(turns.turn, owner, arrived, timeout_s)
