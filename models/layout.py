"""The fastest memory layout per head: ``channels_last`` where it measured faster on the device.

EfficientNet-Lite0's head to split 9 ran 2.56x faster on a CPU in ``channels_last`` (issue 30)
while ResNet18's and ViT-B/16's did not change, so the choice is measured, not assumed: once
per (architecture, split, input shape, device), on a few samples of the request's first batch,
and kept in memory. The timings are the best of two runs each on a shared host, so a process that measured again
could choose the other layout and compute features a few ulps apart from the last; a host
therefore also keeps each choice on disk (``persist``), in HAPI's cache directory through
:mod:`.listing_cache` (a directory ``layout``, one JSON file per key, written whole),
keyed by the head's key, the device and torch's version, so a restarted server runs each head
in the layout it ran before. A file that cannot be read or written costs one timing, logged
once, never a request. Only the input is converted: a convolution given a ``channels_last`` input runs and
answers in that layout, and the head's weights, shared by every request of the model, stay
untouched. The features are equal to float rounding, as any change of kernel gives.

On a CPU the chooser also picks how many samples one forward takes (its ``chunk``): a batch
runs in slices of that many. A head's activations outgrow the caches as the batch grows, and
per image the forward then slows: EfficientNet-Lite0's head to split 9 (batch norms folded,
``channels_last``, one thread of a 2-core AMD EPYC) took 7.2 ms per image in slices of 4 and
18.4 ms as one batch of 32; ResNet18's to split 6 11.6 and 16.9 ms; ViT-B/16's the same either
way (issue 30). Where the knee lies depends on the host's caches, so it is measured with the
layout, on the same probe, and kept with it. The COS batch stays what the memory planner
sized: a slice's activations are a part of the batch's.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import torch

from . import listing_cache

__all__ = [
    "PROBE_FORWARD_S",
    "PROBE_SAMPLES",
    "STORE_KIND",
    "LayoutChooser",
    "probe_samples",
    "run_in_chunks",
    "stored_key",
    "to_layout",
]

log = logging.getLogger(__name__)

# channels_last (or a slice size) must win by this much: each timing is the best of two runs on
# a shared host. At 0.9 with one run each, ResNet18's whole backbone stayed contiguous at 0.90
# of its time, where channels_last ran 1.24x faster on a batch of 32 (issue 30).
_MARGIN = 0.95
#: Timed runs per timing, the best kept (a shared host's load only ever slows a run down).
_TIMED_RUNS = 2
#: The samples of a key's first batch each layout is timed on: the two layouts' ratio is what is
#: compared, and eight samples keep a convolution's working set near a batch's (its activations
#: outgrow the caches either way) while the timing costs a first request one batch of 32, not 3.
PROBE_SAMPLES = 8
#: Seconds one forward of the probe may take: a heavier head is timed on fewer samples (down to
#: one, too few to time slice sizes on). Each layout runs three times and each slice size three
#: more: at eight samples ViT-B/16's whole head (0.4 s a sample on one core of a 2-core AMD EPYC)
#: cost its first request twelve forwards of eight samples, about 40 s, to choose between two
#: layouts its tokens do not have. A head that heavy computes far more per byte of activations
#: than the caches can hold back, which is where a slice size wins (the knee above).
PROBE_FORWARD_S = 0.5
#: The kept choices' directory in HAPI's cache directory.
STORE_KIND = "layout"
#: Bumped when a kept choice's key or entry changes: older files are then simply not found.
#: 2: the slice size per forward (``chunk``), and heads timed with their batch norms folded.
#: 3: each timing the best of two runs, and a 5 % margin.
_FORMAT = 3
#: The slice sizes a CPU probe is timed at besides the whole probe, largest first (two: each
#: costs a first request three forwards of the probe).
_CHUNKS = (4, 1)


def to_layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    if channels_last and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def run_in_chunks(
    head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, chunk: int | None
) -> torch.Tensor:
    """``head(x)``, ``chunk`` samples per call (None: all at once)."""
    if chunk is None or len(x) <= chunk:
        return head(x)
    return torch.cat([head(part) for part in x.split(chunk)])


class LayoutChooser:
    """Measures and keeps, per key, whether a head runs faster on a ``channels_last`` input."""

    def __init__(self, enabled: bool = True, *, persist: bool = False) -> None:
        """``persist``: read and keep each choice on disk too (a key must then be JSON's types:
        strings, numbers, tuples of them); off, choices live as long as this object."""
        self.enabled = enabled
        self.persist = persist
        self._lock = threading.Lock()
        self._choices: dict[Hashable, bool] = {}
        self._chunks: dict[Hashable, int | None] = {}

    def known(self, key: Hashable) -> bool | None:
        with self._lock:
            return self._choices.get(key)

    def chunk(self, key: Hashable) -> int | None:
        """The samples per forward kept for ``key`` (None: the whole batch, or not chosen)."""
        with self._lock:
            return self._chunks.get(key)

    def forward(
        self, key: Hashable, head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        """``head(x)`` in the layout chosen for ``key``; the first call for a key measures both."""
        if not self.enabled or x.dim() != 4:
            return head(x)
        choice = self.known(key)
        if choice is None and self.persist:
            choice = self._read_kept(key, x.device)
        if choice is not None:
            return run_in_chunks(head, to_layout(x, choice), self.chunk(key))
        # Each layout runs three times (a warm-up, then the timed runs): on the whole batch, that
        # would cost a first request five batches' work beyond its own. One sample first says
        # how heavy the head is (a first run: an overestimate, so never too many samples).
        start = time.perf_counter()
        head(x[:1])
        _sync(x)
        probe = x[: probe_samples(time.perf_counter() - start, len(x))]
        contiguous = _timed(head, probe)
        last = _timed(head, to_layout(probe, True))
        choice = last[0] < _MARGIN * contiguous[0]
        whole_s = last[0] if choice else contiguous[0]
        chunk, chunk_s = _fastest_chunk(head, to_layout(probe, choice), whole_s)
        with self._lock:
            # A request measuring the same key meanwhile: the first choice stays, on disk too.
            kept = self._choices.setdefault(key, choice)
            if kept == choice:
                self._chunks.setdefault(key, chunk)
            kept_chunk = self._chunks.get(key)
        log.info(
            "layout of %s: %s, %s (contiguous %.1f ms, channels_last %.1f ms, %s)",
            key,
            "channels_last" if kept else "contiguous",
            "whole batch" if kept_chunk is None else f"{kept_chunk} sample(s) per forward",
            contiguous[0] * 1000,
            last[0] * 1000,
            ", ".join(f"{n} per forward {t * 1000:.1f} ms" for n, t in chunk_s.items()) or "-",
        )
        if self.persist:
            stored = stored_key(key, x.device)
            if stored is not None:
                entry = {
                    "channels_last": kept,
                    "chunk": kept_chunk,
                    "contiguous_s": contiguous[0],
                    "last_s": last[0],
                }
                listing_cache.write_entry(stored, entry, kind=STORE_KIND)
        if len(probe) < len(x) or kept_chunk is not None:
            return run_in_chunks(head, to_layout(x, kept), kept_chunk)
        # The kept layout's output, not this timing's winner: one key, one layout's features.
        return last[1] if kept else contiguous[1]

    def _read_kept(self, key: Hashable, device: torch.device) -> bool | None:
        stored = stored_key(key, device)
        entry = None if stored is None else listing_cache.read_entry(stored, kind=STORE_KIND)
        choice = None if entry is None else entry.get("channels_last")
        chunk = None if entry is None else entry.get("chunk")
        if not isinstance(choice, bool) or not (chunk is None or _is_count(chunk)):
            return None
        with self._lock:
            if self._choices.setdefault(key, choice) == choice:
                self._chunks.setdefault(key, chunk)
            choice = self._choices[key]
        log.info("layout of %s: %s (kept)", key, "channels_last" if choice else "contiguous")
        return choice


def probe_samples(per_sample_s: float, available: int) -> int:
    """How many of ``available`` samples the layouts are timed on: :data:`PROBE_SAMPLES`, fewer
    where a forward of them would take longer than :data:`PROBE_FORWARD_S`, at least one."""
    fits = int(PROBE_FORWARD_S / per_sample_s) if per_sample_s > 0 else PROBE_SAMPLES
    return max(1, min(available, PROBE_SAMPLES, fits))


def stored_key(key: Hashable, device: torch.device) -> dict[str, Any] | None:
    """What a kept choice is filed under: the head's key (architecture, split, input shape:
    no weights), the device and its name, torch's version; None for a key JSON cannot hold."""
    try:
        # As JSON reads it back (tuples become lists): the stored key is compared as read.
        head = json.loads(json.dumps(key))
    except (TypeError, ValueError):
        return None
    return {
        "format": _FORMAT,
        "head": head,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
    }


def _fastest_chunk(
    head: Callable[[torch.Tensor], torch.Tensor], probe: torch.Tensor, whole: float
) -> tuple[int | None, dict[int, float]]:
    """The slice size that runs ``probe`` fastest on a CPU, if it beats the whole probe
    (``whole`` seconds, its layout's timing) by the margin (None: the whole batch); and each
    size's seconds. Off a CPU, or on a probe too small to tell, nothing is timed: a GPU wants
    its batch whole."""
    if probe.device.type != "cpu" or len(probe) < 2 * _CHUNKS[0]:
        return None, {}
    seconds = {
        n: _timed(functools.partial(run_in_chunks, head, chunk=n), probe)[0] for n in _CHUNKS
    }
    best = min(seconds, key=lambda n: seconds[n])
    return (best if seconds[best] < _MARGIN * whole else None), {len(probe): whole, **seconds}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _timed(
    head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> tuple[float, torch.Tensor]:
    """The best of :data:`_TIMED_RUNS` runs after a first that pays one-off allocations and
    kernel choices; and the last run's output."""
    y = head(x)
    _sync(x)
    best = float("inf")
    for _ in range(_TIMED_RUNS):
        start = time.perf_counter()
        y = head(x)
        _sync(x)
        best = min(best, time.perf_counter() - start)
    return best, y


def _sync(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
