"""Bandwidth as the application sees it: a probe read, then a moving estimate of observed transfers."""

from __future__ import annotations

import statistics
import threading
import time

from .errors import ConfigurationError

__all__ = ["BandwidthEstimator", "StreamClock"]

#: A pause between two chunks of a stream longer than this many typical ones, and than
#: ``IDLE_GAP_S``, is the sender having nothing to send (a server computing its next batch),
#: not the link carrying bytes.
IDLE_GAP_FACTOR = 8.0
IDLE_GAP_S = 0.02


class BandwidthEstimator:
    """Exponentially weighted throughput over observed transfers (bytes/s).

    Each observation is one response body: its bytes and the seconds from the first to the
    last byte (so server compute before the first byte does not count as slow network).
    Transfers that are too small to time are folded together until they are large enough.
    ``override`` pins the estimate (a user who knows the link).
    """

    def __init__(
        self, *, alpha: float = 0.3, override: float | None = None, min_bytes: int = 256 * 1024
    ) -> None:
        if not 0 < alpha <= 1:
            raise ConfigurationError("alpha must be in (0, 1]")
        if override is not None and override <= 0:
            raise ConfigurationError("bandwidth override must be positive")
        self.alpha = alpha
        self.override = override
        self.min_bytes = min_bytes
        self._estimate: float | None = None
        self._pending_bytes = 0
        self._pending_s = 0.0
        self._lock = threading.Lock()
        self.observations = 0

    def observe(self, nbytes: int, seconds: float) -> None:
        """Count a transfer of ``nbytes`` that took ``seconds`` (ignored unless both are > 0)."""
        if nbytes <= 0 or seconds <= 0:
            return
        with self._lock:
            self._pending_bytes += nbytes
            self._pending_s += seconds
            if self._pending_bytes < self.min_bytes:
                return
            rate = self._pending_bytes / self._pending_s
            self._pending_bytes, self._pending_s = 0, 0.0
            self.observations += 1
            if self._estimate is None:
                self._estimate = rate
            else:
                self._estimate = self.alpha * rate + (1 - self.alpha) * self._estimate

    @property
    def bytes_per_s(self) -> float | None:
        """The override if set, else the current estimate (None before enough bytes)."""
        if self.override is not None:
            return self.override
        return self._estimate

    def drifted(self, reference: float, tolerance: float = 0.25) -> bool:
        """Whether the estimate moved more than ``tolerance`` (relative) from ``reference``."""
        current = self.bytes_per_s
        return current is not None and abs(current - reference) > tolerance * reference


class StreamClock:
    """Times one streamed response as the link carried it, for :meth:`BandwidthEstimator.observe`.

    An extraction response is a burst of frames per COS batch, with the server computing in
    between: timed from its first byte to its last, it measures the server, not the link (a
    ConvNeXt head shipping a few megabytes over a gigabit link read as a few Mbit/s). So each
    pause between chunks much longer than the stream's typical one (:data:`IDLE_GAP_FACTOR`,
    at least :data:`IDLE_GAP_S`) is left out, with the chunk that ended it (its bytes may have
    waited in a buffer); what remains is the bytes the link carried and the time it took.
    """

    def __init__(self) -> None:
        self._last: float | None = None
        self._gaps: list[tuple[float, int]] = []

    def chunk(self, nbytes: int, now: float | None = None, *, continues: bool = True) -> None:
        """Count a chunk of ``nbytes`` that arrived at ``now`` (default: the clock).

        ``continues=False``: the chunk begins a new frame of a framed stream, so the pause
        before it is the sender's between two frames, never the link's. A stream of small
        frames (a COS batch of 32 samples at the freeze index: 32 KB) has no longer pause
        to tell them apart by: the median rule then timed the server, 2 Mbit/s on a 5 Mbit/s
        link. Only the pauses inside a frame are counted; a stream whose frames each arrive
        in one chunk tells nothing."""
        t = time.perf_counter() if now is None else now
        if self._last is not None and continues:
            self._gaps.append((t - self._last, nbytes))
        self._last = t

    def carried(self) -> tuple[int, float]:
        """The bytes the link carried and the seconds it took, idle pauses left out. The first
        chunk is not counted: the time before it is the request's and the sender's."""
        if not self._gaps:
            return 0, 0.0
        typical = statistics.median(g for g, _ in self._gaps)
        limit = max(IDLE_GAP_S, IDLE_GAP_FACTOR * typical)
        busy = [(g, n) for g, n in self._gaps if g <= limit]
        return sum(n for _, n in busy), sum(g for g, _ in busy)

    def report(self, estimator: BandwidthEstimator | None) -> None:
        if estimator is not None:
            estimator.observe(*self.carried())
