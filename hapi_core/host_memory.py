"""The host's memory as HAPI measures it: the process's resident memory (:func:`resident_bytes`,
sampled by :class:`ResidentSampler`) and the measured host memory of a lone batch
(:class:`HostMemoryProbe`, a CPU device's peaks, as a GPU's come from CUDA's statistics).
"""

from __future__ import annotations

import _thread
import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .locks import os_lock

log = logging.getLogger(__name__)

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int | str = "self") -> int:
    """Resident bytes of a process now (``/proc/<pid>/statm``, second field); 0 without /proc."""
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
        return int(fields[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def _os_thread_api() -> tuple[type[threading.Thread], type[threading.Event]]:
    # Under eventlet's patching (the Swift proxy) a threading.Thread is a green thread, which
    # samples only when the hub runs: the sampler must be a real OS thread (see locks.py).
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        real = patcher.original("threading")
        return real.Thread, real.Event
    return threading.Thread, threading.Event


#: A change of the resident memory smaller than this is the process standing still.
STILL_BYTES = 1 << 20
#: Standing still this long, the sampler slows to :data:`IDLE_INTERVAL_S`.
STILL_S = 1.0
IDLE_INTERVAL_S = 0.25


class ResidentSampler:
    """The peak resident memory of a process, read from ``/proc/<pid>/statm`` every
    ``interval_s`` by a daemon OS thread while the memory moves.

    ``VmHWM`` is never reset (``clear_refs`` would make every other reader's ``VmHWM``
    under-read): the peaks are this sampler's own, a process-wide one since :meth:`start` and a
    *window* one since :meth:`reset_window`. A peak shorter than the interval can be missed;
    :meth:`sample` reads one more point on demand (the end of a measured batch, say).

    Once the memory has stayed within :data:`STILL_BYTES` for :data:`STILL_S`, the thread
    samples every :data:`IDLE_INTERVAL_S` instead, until a reading moves again or a caller
    samples or opens a window (which wakes it at once). At 10 ms, an idle server or proxy spent
    about 2 % of a core reading its own memory, and the test suite runs over a dozen of them.
    """

    def __init__(
        self,
        read: Callable[[], int] = resident_bytes,
        interval_s: float = 0.01,
    ) -> None:
        self._read = read
        self.interval_s = interval_s
        self._lock = os_lock()
        self._peak = 0
        self._window_peak = 0
        thread_cls, event_cls = _os_thread_api()
        self._thread_cls = thread_cls
        self._stop = event_cls()
        self._wake = event_cls()
        self._thread: threading.Thread | None = None
        self._last = 0
        self._moved_at = time.monotonic()

    def sample(self) -> int:
        """Read the resident bytes now, fold them into the peaks and return them (and sample
        at the full rate again: a caller reads when something happens)."""
        now = self._fold(self._read())
        self._busy()
        return now

    def _fold(self, now: int) -> int:
        with self._lock:
            self._peak = max(self._peak, now)
            self._window_peak = max(self._window_peak, now)
            if abs(now - self._last) >= STILL_BYTES:
                self._last, self._moved_at = now, time.monotonic()
        return now

    def _busy(self) -> None:
        with self._lock:
            idle = time.monotonic() - self._moved_at >= STILL_S
            self._moved_at = time.monotonic()
        if idle:
            self._wake.set()

    @property
    def peak_bytes(self) -> int:
        """The highest resident memory sampled since :meth:`start`."""
        with self._lock:
            return self._peak

    @property
    def window_peak_bytes(self) -> int:
        """The highest resident memory sampled since :meth:`reset_window`."""
        with self._lock:
            return self._window_peak

    def reset_window(self) -> int:
        """Start a new window at the resident memory now (returned), sampling if not yet."""
        self.start()
        now = self._read()
        with self._lock:
            self._window_peak = now
            self._peak = max(self._peak, now)
        self._busy()
        return now

    def start(self, interval_s: float | None = None) -> None:
        """Sample from now on (idempotent; ``interval_s`` applies from the next sample)."""
        if interval_s is not None:
            self.interval_s = interval_s
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = self._thread_cls(
                target=self._run, name="hapi-resident-sampler", daemon=True
            )
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (the peaks stay readable)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join(timeout=5 * self.interval_s + 1)

    def _interval(self) -> float:
        with self._lock:
            still = time.monotonic() - self._moved_at >= STILL_S
        return max(self.interval_s, IDLE_INTERVAL_S) if still else self.interval_s

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval())
            self._wake.clear()
            if not self._stop.is_set():
                self._fold(self._read())


PROCESS_MEMORY = ResidentSampler()
"""The sampler of this process's resident memory: ``/metrics`` and the batch probe read it."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc_mallinfo2() -> Callable[[], int] | None:
    """The bytes glibc's malloc has handed out and not yet got back (``mallinfo2()``: in use in
    its arenas plus its mmap'd blocks); None off glibc >= 2.33."""
    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []

    def in_use() -> int:
        info = fn()
        return int(info.uordblks + info.hblkhd)

    return in_use


def _glibc_free_heap() -> Callable[[], int] | None:
    """The bytes glibc's malloc holds free in its arenas for reuse (``mallinfo2().fordblks``);
    None off glibc >= 2.33."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return lambda: int(fn().fordblks)


_FREE_HEAP = _glibc_free_heap()


def resident_in_use_bytes(
    rss: Callable[[], int] = resident_bytes,
    free_heap: Callable[[], int] | None = _FREE_HEAP,
) -> int:
    """This process's resident bytes less what malloc holds free for reuse: memory a new
    allocation cannot take without the resident memory growing. Freed blocks that glibc keeps
    (it rarely gives its heap back) stay resident but serve the next request, so counting them
    as occupied would refuse requests that fit."""
    free = free_heap() if free_heap is not None else 0
    return max(0, rss() - free)


def _read_status() -> dict[str, int]:
    """``VmRSS`` now and the highest ``VmRSS`` sampled since :func:`_reset_peak`, in bytes (the
    names ``/proc/self/status`` gives them, whose ``VmHWM`` is left alone)."""
    rss = PROCESS_MEMORY.sample()
    if rss == 0:
        raise OSError("no /proc/self/statm")
    return {"VmRSS": rss, "VmHWM": PROCESS_MEMORY.window_peak_bytes}


def _reset_peak() -> None:
    PROCESS_MEMORY.reset_window()


ProbeKey = tuple[str, int, tuple[int, ...]]


@dataclass
class HostMemoryProbe:
    """Measures the host memory a batch takes, when nothing else in the process could disturb it.

    A CPU has no per-request allocator statistics, and the process's memory figures are shared
    by every thread, so a batch is measured only when its request is the only one admitted in
    the whole process (all devices: a GPU request decodes on the host too) from the batch's
    start to its end. The schedulers report every admission and release here; any of them
    during the batch voids the reading. Admitted requests cover model loads, fine-tuning and
    streaming, so what can still move memory meanwhile is the event loop reading new shards
    (more memory: the reading is only higher, so safer) and freeing a finished request's shard
    (at most one object; the estimator's margin and floor cover it).

    The reading is the larger of two growths over the batch, per sample:

    * resident memory: its sampled peak over the batch minus its value at the start
      (:data:`PROCESS_MEMORY`'s window; named ``VmHWM - VmRSS`` below), which sees transients
      longer than the sampling interval, inside an operator too, but not memory the allocator
      already held free and handed out again;
    * malloc's bytes in use (``mallinfo2``), sampled after every leaf module of ``module`` and at
      the end, which sees that reuse (glibc's default, adaptive mmap threshold keeps freed
      blocks of a previous batch in its heap) at layer boundaries.

    Without glibc's ``mallinfo2`` the reuse cannot be seen and nothing is measured. The kernel's
    ``VmHWM`` is never reset (``clear_refs`` made every other reader's peak under-read). Only the
    first ``calibration_batches`` clean readings of each head are taken (the engine takes one
    per request), and batches whose input is under ``min_input_bytes`` are skipped: page
    granularity and the allocator's fixed costs would dominate a small one.
    """

    calibration_batches: int = 4
    min_input_bytes: int = 16 * 2**20
    read_status: Callable[[], dict[str, int]] = _read_status
    reset_peak: Callable[[], None] = _reset_peak
    heap_in_use: Callable[[], int] | None = field(default_factory=_glibc_mallinfo2)
    _lock: _thread.LockType = field(default_factory=os_lock, init=False, repr=False)
    _admitted: int = field(default=0, init=False)
    _events: int = field(default=0, init=False)
    """Admissions and releases so far: a change during a batch voids its reading."""
    _measuring: bool = field(default=False, init=False)
    _clean: dict[ProbeKey, int] = field(default_factory=dict, init=False)
    """Clean readings per head."""
    _disabled: bool = field(default=False, init=False)

    def admitted(self) -> None:
        """A request got memory (any device of this process)."""
        with self._lock:
            self._admitted += 1
            self._events += 1

    def released(self) -> None:
        with self._lock:
            self._admitted = max(0, self._admitted - 1)
            self._events += 1

    def wants(self, key: ProbeKey, input_bytes: int) -> bool:
        """Whether a batch of this head with ``input_bytes`` of input would be measured now."""
        with self._lock:
            return (
                not self._disabled
                and self.heap_in_use is not None
                and not self._measuring
                and self._admitted == 1
                and input_bytes >= self.min_input_bytes
                and self._clean.get(key, 0) < self.calibration_batches
            )

    @contextmanager
    def measure(
        self,
        key: ProbeKey,
        samples: int,
        input_bytes: int,
        module: torch.nn.Module | None = None,
    ) -> Iterator[ProbeReading]:
        """Measure the body's peak host memory per sample into the yielded reading, if it can
        be measured cleanly (``reading.bytes_per_sample`` stays None otherwise)."""
        reading = ProbeReading()
        if samples <= 0 or not self.wants(key, input_bytes):
            yield reading
            return
        heap_in_use = self.heap_in_use
        assert heap_in_use is not None
        with self._lock:
            self._measuring = True
            events = self._events
        hooks = []
        try:
            start = self._start(heap_in_use)
            reading.reset = start is not None
            if start is not None and module is not None:

                def sample(*_: object) -> None:
                    reading.heap_peak = max(reading.heap_peak, heap_in_use())

                leaves = [m for m in module.modules() if next(m.children(), None) is None]
                hooks = [m.register_forward_hook(sample) for m in leaves]
            yield reading
            if start is None:
                return
            rss, heap = start
            hwm = self.read_status()["VmHWM"]
            reading.heap_peak = max(reading.heap_peak, heap_in_use())
            with self._lock:
                if self._events != events or self._admitted != 1:
                    return  # another request came or went: the reading is not this batch's
                self._clean[key] = self._clean.get(key, 0) + 1
            grown = max(hwm - rss, reading.heap_peak - heap, 0)
            reading.bytes_per_sample = grown / samples
        finally:
            for hook in hooks:
                hook.remove()
            with self._lock:
                self._measuring = False

    def _start(self, heap_in_use: Callable[[], int]) -> tuple[int, int] | None:
        """Start the peak's window; the resident bytes and malloc's bytes in use now."""
        try:
            self.reset_peak()
            return self.read_status()["VmRSS"], heap_in_use()
        except (OSError, KeyError, ValueError) as exc:
            # No /proc (not Linux): measure nothing from now on.
            log.info("host memory of batches is not measured: %r", exc)
            with self._lock:
                self._disabled = True
            return None


@dataclass
class ProbeReading:
    bytes_per_sample: float | None = None
    """The body's peak per sample; None when it could not be measured cleanly."""
    reset: bool = False
    """Whether the resident peak's window was started for it."""
    heap_peak: int = 0
    """The most bytes malloc had in use at a sample."""


HOST_MEMORY = HostMemoryProbe()
"""The one probe of this process: host memory is the process's, whatever device runs a batch."""
