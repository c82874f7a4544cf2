"""glibc's malloc held to the memory a process uses, so that its resident size follows the plan.

The planner counts what requests hold while they run (:mod:`hapi_core.adaptation`); the
budget is met only if memory a finished request freed leaves the process, or is reused by
the next. glibc's defaults break that in two ways, both measured on the in-proxy proxy of
issue 27 (1 GiB budget, eight 576 px ResNet18 requests, two at a time): 2001 MiB sampled peak
and 1903 MiB still resident once every request had ended, with nothing of theirs alive.

* **Arenas per thread.** Each thread that allocates while another holds an arena's lock gets
  an arena of its own, up to eight per core; a block freed into one arena serves only the
  threads bound to it, so every pool thread (eventlet's, the decode pool's, torch's) keeps its
  own high-water mark. Two arenas: 1415 MiB peak, 1414 MiB after.
* **The dynamic mmap threshold.** A block above the threshold is mmap'd and unmapped when
  freed, but freeing one raises the threshold to its size (up to 32 MiB), so later activations
  and decoded images of that size are carved from the heap, whose free space is kept. A fixed
  1 MiB threshold with the two arenas: 1034 MiB peak, 828 MiB after.

A fixed threshold gives every tensor of a megabyte or more back to the kernel when it is
freed (an mmap and its page faults per such allocation: microseconds against a batch's
milliseconds); smaller blocks are reused from at most two arenas. The arena limit takes effect
only if it is set before a second arena exists (glibc fixes the limit when it first needs
one): the Swift filter sets it when the proxy loads it, before any pool thread runs, and the
runtime again (idempotent) for a host that starts it first. Off glibc nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "bound_host_allocator"]

log = logging.getLogger(__name__)

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

ARENA_MAX = 2
"""Arenas glibc may create: the hub's and one that the pool threads share."""
MMAP_THRESHOLD_BYTES = 1 << 20
"""Blocks this large or larger are mmap'd, and so unmapped when freed."""
TRIM_THRESHOLD_BYTES = 4 << 20
"""Free space at a heap's top beyond this is returned to the kernel."""

_applied: bool | None = None


def _mallopt() -> Callable[[int, int], int] | None:
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    return fn  # type: ignore[no-any-return]


def bound_host_allocator(mallopt: Callable[[int, int], int] | None = None) -> bool:
    """Set glibc's arena limit, mmap threshold and trim threshold (see the module doc), once per
    process; whether they are set (False off glibc, or if glibc refused one). ``mallopt``
    stands in for glibc's (a test's), and is called every time."""
    global _applied
    if mallopt is not None:
        return _apply(mallopt)
    if _applied is None:
        fn = _mallopt()
        if fn is None:
            log.info("malloc is not glibc's: its arenas and thresholds are left as they are")
        _applied = fn is not None and _apply(fn)
    return _applied


def _apply(mallopt: Callable[[int, int], int]) -> bool:
    settings = (
        (_M_ARENA_MAX, ARENA_MAX),
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    )
    # mallopt answers 1 on success, 0 for a parameter or value it refuses.
    ok = all([mallopt(param, value) == 1 for param, value in settings])
    if not ok:
        log.warning("glibc refused a malloc setting: freed memory may stay resident")
    return ok
