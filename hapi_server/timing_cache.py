"""The per-layer times ``POST /v1/timings`` measured, kept per model and device.

A layer's time depends on the architecture, the class count (the classifier), the input shape
and the device, not on the weights' values or the images: measured once, served from here after.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["LayerTimes", "TimingKey"]

#: (architecture, class count, input shape, device name)
TimingKey = tuple[str, int, tuple[int, int, int], str]


@dataclass
class LayerTimes:
    """Seconds per sample of each layer measured so far, per model and device."""

    _times: dict[TimingKey, list[float]]
    _lock: threading.Lock

    @classmethod
    def empty(cls) -> LayerTimes:
        return cls({}, threading.Lock())

    def get(self, key: TimingKey, layers: int) -> list[float] | None:
        with self._lock:
            known = self._times.get(key)
        return known[:layers] if known is not None and len(known) >= layers else None

    def put(self, key: TimingKey, times: list[float]) -> None:
        with self._lock:
            if len(times) > len(self._times.get(key, [])):
                self._times[key] = list(times)
