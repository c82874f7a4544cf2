"""The in-proxy execution's concurrency slots, with a bounded wait for one.

A request holds a slot from its admission to the end of its stream, so a slot frees only when
a request ends. The wait for one comes before the core's scheduler, so it is bounded here as
the scheduler bounds its own queue: at most ``queue_limit`` requests wait (the next one is
refused at once with the core's 503 ``queue_full`` and ``Retry-After``, as the HAPI server
refuses a full queue), and none waits past its deadline (the core's 504 ``timeout``). A wait
that could not end would otherwise hold one of the proxy's connections (``max_clients``) for
as long as the slow requests before it, and plain GETs would queue behind them.
"""

from __future__ import annotations

import time

from eventlet.semaphore import Semaphore

from hapi_core.errors import QueueFullError, RequestTimeoutError

__all__ = ["Slots"]


class Slots:
    """``size`` slots; :meth:`acquire` waits for one within the bounds of the module doc."""

    def __init__(self, size: int, *, queue_limit: int, retry_after_s: int) -> None:
        self._free = Semaphore(size)
        self.size = size
        self.queue_limit = queue_limit
        self.retry_after_s = retry_after_s
        self.waiting = 0

    @property
    def busy(self) -> int:
        """Slots taken now."""
        return self.size - self._free.counter

    def acquire(self, deadline: float, request_id: str) -> None:
        """Take a slot by ``deadline`` (``time.monotonic``): QueueFullError when ``queue_limit``
        requests already wait, RequestTimeoutError when the deadline passes first."""
        if self._free.acquire(blocking=False):
            return
        if self.waiting >= self.queue_limit:
            raise QueueFullError(
                f"all {self.size} in-proxy slots are busy and {self.waiting} requests already "
                "wait for one (queue_limit)",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.waiting += 1
        try:
            taken = self._free.acquire(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            self.waiting -= 1
        if not taken:
            raise RequestTimeoutError(
                f"request {request_id} found no free in-proxy slot within request_timeout"
            )

    def release(self) -> None:
        self._free.release()
