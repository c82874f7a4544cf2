"""The head timings ``POST /v1/timings`` measured, kept per model, input shape and device.

A layer's time depends on the architecture, the class count (the classifier), the input shape
and the device, not on the weights' values nor on whose request it is: one measurement serves
every later request and every user. So the cache is keyed without the weights, and a request
whose layers a measurement already covers, at the same wire dtype and compression, is answered
from it without running the model (its decode, which depends on the dataset's images, is still
timed: a few images, milliseconds). The wire sizes at a split are the features' frames: fixed
by the shapes without compression, and close to fixed with it (what compresses is mostly the
zeros after a ReLU, which the architecture makes), so they are kept too.
"""

from __future__ import annotations

import _thread
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .locks import os_lock

__all__ = ["HeadTimes", "LayerTimes", "TimingKey"]

#: (architecture, class count, input shape, device name): no weights in it.
TimingKey = tuple[str, int, tuple[int, int, int], str]
#: A timing key and the wire's dtype and compression, which the frames' sizes depend on.
HeadKey = tuple[TimingKey, str, str]

#: Distinct (model, shape, device, wire format) heads kept: far more than one host serves.
MAX_HEADS = 512


@dataclass(frozen=True)
class HeadTimes:
    """Per sample, for the layers ``[0, len(layer_s))``: each layer's time, its output's
    encoding time and its frame's bytes."""

    layer_s: list[float]
    encode_s: list[float]
    wire_bytes: list[float]

    def __len__(self) -> int:
        return min(len(self.layer_s), len(self.encode_s), len(self.wire_bytes))

    def first(self, layers: int) -> HeadTimes:
        return HeadTimes(self.layer_s[:layers], self.encode_s[:layers], self.wire_bytes[:layers])


@dataclass
class LayerTimes:
    """The head timings measured so far; thread-safe, bounded (least recently used out)."""

    _times: dict[TimingKey, list[float]]
    _lock: _thread.LockType
    _heads: OrderedDict[HeadKey, HeadTimes] = field(default_factory=OrderedDict)
    max_heads: int = MAX_HEADS
    hits: int = 0
    """Requests answered from the cache, the model not run."""
    measured: int = 0
    """Requests whose head ran to be timed."""

    @classmethod
    def empty(cls, max_heads: int = MAX_HEADS) -> LayerTimes:
        return cls({}, os_lock(), OrderedDict(), max_heads)

    def get(self, key: TimingKey, layers: int) -> list[float] | None:
        with self._lock:
            known = self._times.get(key)
        return known[:layers] if known is not None and len(known) >= layers else None

    def merge(self, key: TimingKey, times: list[float]) -> list[float]:
        """Keep the fastest time seen per layer and return them for ``times``' layers.

        The minimum is the least disturbed by whatever else ran on the device meanwhile.
        """
        with self._lock:
            known = self._times.get(key, [])
            best = [min(a, b) for a, b in zip(known, times, strict=False)]
            best += known[len(best) :] or times[len(best) :]
            self._times[key] = best
            return best[: len(times)]

    def head(self, key: TimingKey, dtype: str, compression: str, layers: int) -> HeadTimes | None:
        """The kept timings of layers ``[0, layers)`` at this wire format, counted as a hit;
        None (nothing counted) when no measurement covers them."""
        with self._lock:
            known = self._heads.get((key, dtype, compression))
            if known is None or len(known) < layers:
                return None
            self._heads.move_to_end((key, dtype, compression))
            self.hits += 1
            return known.first(layers)

    def record(
        self,
        key: TimingKey,
        dtype: str,
        compression: str,
        layer_s: Sequence[float],
        encode_s: Sequence[float],
        wire_bytes: Sequence[float],
    ) -> HeadTimes:
        """Keep a measured head (the layer times merged with those known) and return it.

        A shorter measurement never replaces a longer one's later layers: a request up to
        split 5 after one up to split 20 keeps all 20.
        """
        merged = self.merge(key, list(layer_s))
        with self._lock:
            self.measured += 1
            hk = (key, dtype, compression)
            known = self._heads.get(hk)
            encode, sizes = list(encode_s), list(wire_bytes)
            if known is not None and len(known) > len(merged):
                encode += known.encode_s[len(encode) :]
                sizes += known.wire_bytes[len(sizes) :]
            full = self._times[key][: len(encode)]
            self._heads[hk] = HeadTimes(full, encode, sizes)
            self._heads.move_to_end(hk)
            while len(self._heads) > self.max_heads:
                self._heads.popitem(last=False)
        return HeadTimes(merged, list(encode_s), list(wire_bytes))
