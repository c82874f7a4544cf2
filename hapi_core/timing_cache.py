"""The per-layer times ``POST /v1/timings`` measured, kept per model and device.

A layer's time depends on the architecture, the class count (the classifier), the input shape
and the device, not on the weights' values or the images: the first request measures it after a
warm-up pass, later ones refine it (the fastest of all seen).
"""

from __future__ import annotations

import _thread
from dataclasses import dataclass

from .locks import os_lock

__all__ = ["LayerTimes", "TimingKey"]

#: (architecture, class count, input shape, device name)
TimingKey = tuple[str, int, tuple[int, int, int], str]


@dataclass
class LayerTimes:
    """Seconds per sample of each layer measured so far, per model and device."""

    _times: dict[TimingKey, list[float]]
    _lock: _thread.LockType

    @classmethod
    def empty(cls) -> LayerTimes:
        return cls({}, os_lock())

    def get(self, key: TimingKey, layers: int) -> list[float] | None:
        with self._lock:
            known = self._times.get(key)
        return known[:layers] if known is not None and len(known) >= layers else None

    def merge(self, key: TimingKey, times: list[float]) -> list[float]:
        """Keep the fastest time seen per layer and return them for ``times``' layers.

        Every timing request times the layers again (it runs them anyway, to size their output);
        the minimum is the least disturbed by whatever else ran on the device meanwhile.
        """
        with self._lock:
            known = self._times.get(key, [])
            best = [min(a, b) for a, b in zip(known, times, strict=False)]
            best += known[len(best) :] or times[len(best) :]
            self._times[key] = best
            return best[: len(times)]
