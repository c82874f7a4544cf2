"""A client-side token-bucket throttle, the fallback when the link cannot be shaped with tc.

Written here rather than taken from aiolimiter because the transfer loops are synchronous
(httpx and swiftclient iterators in worker threads) and must share one bucket across threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .errors import ConfigurationError

__all__ = ["TokenBucket"]


class TokenBucket:
    """Blocks ``consume(n)`` callers so that the long-run rate stays at ``rate_bytes_per_s``.

    ``clock`` (seconds, monotonic) and ``sleep`` default to :mod:`time`'s; tests pass a fake
    clock whose ``sleep`` advances it, so the bucket's arithmetic is checked without waiting.
    """

    def __init__(
        self,
        rate_bytes_per_s: float,
        burst_bytes: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate_bytes_per_s <= 0:
            raise ConfigurationError("rate must be positive")
        self.rate = float(rate_bytes_per_s)
        # A burst of at most 20 ms of traffic, so short transfers cannot run far above the rate.
        self.burst = float(
            burst_bytes if burst_bytes is not None else min(256 * 1024, self.rate * 0.02)
        )
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()

    def consume(self, nbytes: int) -> None:
        """Take ``nbytes`` tokens, sleeping for the deficit if the bucket runs below empty."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= nbytes
            deficit = -self._tokens
        if deficit > 0:
            # Holding back the reader is the throttle itself, not a stand-in for synchronisation.
            self._sleep(deficit / self.rate)
