"""Bandwidth as the application sees it: a probe read, then a moving estimate of observed transfers."""

from __future__ import annotations

import threading

from .errors import ConfigurationError

__all__ = ["BandwidthEstimator"]


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
