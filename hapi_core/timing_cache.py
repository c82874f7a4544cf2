"""The head timings ``POST /v1/timings`` measured, kept per model, input shape and device.

A layer's time depends on the architecture, the class count (the classifier), the input shape
and the device, not on the weights' values nor on whose request it is: one measurement serves
every later request and every user. So the cache is keyed without the weights, and a request
whose layers ``SETTLE_MEASUREMENTS`` measurements already cover, at the same wire dtype and
compression, is answered from them without running the model (its decode, which depends on the
dataset's images, is still timed: a few images, milliseconds). Until then each request measures
the head again, and every time kept is the fastest seen for its layer: a first measurement on a
loaded host (cold caches, other processes) can be twice the steady state, and kept alone it
would outlive the load and mislead every later plan. The wire sizes at a split are the
features' frames: fixed by the shapes without compression, and close to fixed with it (what
compresses is mostly the zeros after a ReLU, which the architecture makes), so the latest
measured are kept too.
"""

from __future__ import annotations

import _thread
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .locks import os_lock

__all__ = ["SETTLE_MEASUREMENTS", "HeadTimes", "LayerTimes", "TimingKey"]

#: (architecture, class count, input shape, device name): no weights in it.
TimingKey = tuple[str, int, tuple[int, int, int], str]
#: A timing key and the wire's dtype and compression, which the frames' sizes depend on.
HeadKey = tuple[TimingKey, str, str]

#: Distinct (model, shape, device, wire format) heads kept: far more than one host serves.
MAX_HEADS = 512
#: Measurements of a head's layers before they are reused without running the model. A single
#: disturbed measurement is corrected by the minimum of a few; the cost is this many bounded
#: timed passes (``hapi_models.TIMED_PASS_S`` each) per (model, shape, device, wire format)
#: in a server's lifetime, after which every request is a hit.
SETTLE_MEASUREMENTS = 3


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


@dataclass(frozen=True)
class _Kept:
    times: HeadTimes
    measurements: list[int]
    """Per layer, the measurements that covered it (non-increasing: each covers a prefix)."""


def _fastest(known: Sequence[float], times: Sequence[float]) -> list[float]:
    """The smaller of the two per layer, and the longer one's layers beyond the other's."""
    best = [min(a, b) for a, b in zip(known, times, strict=False)]
    return best + list(known[len(best) :] or times[len(best) :])


@dataclass
class LayerTimes:
    """The head timings measured so far; thread-safe, bounded (least recently used out)."""

    _times: dict[TimingKey, list[float]]
    _lock: _thread.LockType
    _heads: OrderedDict[HeadKey, _Kept] = field(default_factory=OrderedDict)
    max_heads: int = MAX_HEADS
    settle: int = SETTLE_MEASUREMENTS
    """Measurements of a head's layers before :meth:`head` answers them."""
    hits: int = 0
    """Requests answered from the cache, the model not run."""
    measured: int = 0
    """Requests whose head ran to be timed (the first ``settle`` of a head, and any for more
    layers than those measured as often)."""

    @classmethod
    def empty(cls, max_heads: int = MAX_HEADS, settle: int = SETTLE_MEASUREMENTS) -> LayerTimes:
        return cls({}, os_lock(), OrderedDict(), max_heads, max(1, settle))

    def get(self, key: TimingKey, layers: int) -> list[float] | None:
        with self._lock:
            known = self._times.get(key)
        return known[:layers] if known is not None and len(known) >= layers else None

    def merge(self, key: TimingKey, times: list[float]) -> list[float]:
        """Keep the fastest time seen per layer and return them for ``times``' layers.

        The minimum is the least disturbed by whatever else ran on the device meanwhile.
        """
        with self._lock:
            best = _fastest(self._times.get(key, []), times)
            self._times[key] = best
            return best[: len(times)]

    def head(self, key: TimingKey, dtype: str, compression: str, layers: int) -> HeadTimes | None:
        """The kept timings of layers ``[0, layers)`` at this wire format, counted as a hit;
        None (nothing counted) until ``settle`` measurements have covered them."""
        with self._lock:
            known = self._heads.get((key, dtype, compression))
            if known is None or len(known.times) < layers:
                return None
            if any(n < self.settle for n in known.measurements[:layers]):
                return None
            self._heads.move_to_end((key, dtype, compression))
            self.hits += 1
            return known.times.first(layers)

    def record(
        self,
        key: TimingKey,
        dtype: str,
        compression: str,
        layer_s: Sequence[float],
        encode_s: Sequence[float],
        wire_bytes: Sequence[float],
    ) -> HeadTimes:
        """Keep a measured head and return its kept times for the measured layers: the fastest
        layer and encoding times seen, the measured wire sizes.

        A shorter measurement never replaces a longer one's later layers: a request up to
        split 5 after one up to split 20 keeps all 20 (measured once more up to 5 only).
        """
        measured = len(layer_s)
        self.merge(key, list(layer_s))
        with self._lock:
            self.measured += 1
            hk = (key, dtype, compression)
            known = self._heads.get(hk)
            encode, sizes, counts = list(encode_s), list(wire_bytes), [1] * measured
            if known is not None:
                encode = _fastest(known.times.encode_s, encode)
                sizes += known.times.wire_bytes[len(sizes) :]
                counts = [n + 1 for n in known.measurements[:measured]]
                counts += [1] * (measured - len(counts)) + known.measurements[measured:]
            full = self._times[key][: len(encode)]
            kept = _Kept(HeadTimes(full, encode, sizes), counts)
            self._heads[hk] = kept
            self._heads.move_to_end(hk)
            while len(self._heads) > self.max_heads:
                self._heads.popitem(last=False)
        return kept.times.first(measured)
