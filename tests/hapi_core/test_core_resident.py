"""The process's resident memory: sampled from /proc/<pid>/statm, never by resetting VmHWM
(which made every other reader's peak under-read), and reported by /metrics."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hapi_core import host_memory
from hapi_core.host_memory import (
    HostMemoryProbe,
    ResidentSampler,
    resident_bytes,
    resident_in_use_bytes,
)
from hapi_core.metrics import Metrics

MiB = 2**20
linux_only = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


class Memory:
    """A process's resident bytes, as the test sets them."""

    def __init__(self, rss: int) -> None:
        self.rss = rss

    def __call__(self) -> int:
        return self.rss


def test_the_sampler_keeps_a_process_peak_and_a_window_peak() -> None:
    memory = Memory(100 * MiB)
    # An interval far beyond the test: only the explicit reads below sample.
    sampler = ResidentSampler(memory, interval_s=3600)
    try:
        assert sampler.reset_window() == 100 * MiB
        memory.rss = 300 * MiB
        sampler.sample()
        memory.rss = 150 * MiB
        assert sampler.reset_window() == 150 * MiB
        assert sampler.window_peak_bytes == 150 * MiB and sampler.peak_bytes == 300 * MiB
        memory.rss = 200 * MiB
        sampler.sample()
        assert sampler.window_peak_bytes == 200 * MiB and sampler.peak_bytes == 300 * MiB
    finally:
        sampler.stop()


def test_the_sampler_slows_down_while_the_memory_stands_still(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(host_memory.time, "monotonic", lambda: clock[0])
    memory = Memory(100 * MiB)
    sampler = ResidentSampler(memory, interval_s=0.01)  # never started: no thread reads
    assert sampler._interval() == 0.01
    clock[0] += host_memory.STILL_S
    assert sampler._interval() == host_memory.IDLE_INTERVAL_S
    # The thread's reading of a change brings the full rate back...
    memory.rss += host_memory.STILL_BYTES
    sampler._fold(memory())
    assert sampler._interval() == 0.01
    clock[0] += host_memory.STILL_S
    memory.rss += host_memory.STILL_BYTES // 2  # ...not a reading of a page or two
    sampler._fold(memory())
    assert sampler._interval() == host_memory.IDLE_INTERVAL_S
    # A caller's reading (a batch measured, a window opened) wakes the slowed thread at once.
    assert not sampler._wake.is_set()
    sampler.reset_window()
    sampler.stop()
    assert sampler._interval() == 0.01 and sampler.peak_bytes == memory.rss


@linux_only
def test_resident_bytes_reads_statm() -> None:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    # Within 64 MiB of a second reading: the test's own allocations move it a little.
    assert abs(resident_bytes() - pages * os.sysconf("SC_PAGE_SIZE")) < 64 * MiB
    assert resident_bytes(os.getpid()) > 0
    assert resident_bytes(2**31 - 1) == 0  # no such process


@linux_only
def test_measuring_a_batch_leaves_the_kernels_peak_alone() -> None:
    # A peak well above the resident memory now: 256 MiB, touched, then given back (mmap'd).
    block = bytearray(256 * MiB)
    block[::4096] = b"\x01" * len(block[::4096])
    del block
    before = vm_hwm()
    probe = HostMemoryProbe(calibration_batches=1, min_input_bytes=1)
    probe.admitted()
    with probe.measure(("arch", 1, (3, 8, 8)), 10, 10) as reading:
        pass
    assert reading.reset  # the batch was measured, from the sampled window
    # Before: clear_refs set VmHWM to the RSS of the moment, a quarter GiB under the truth.
    assert vm_hwm() >= before


def test_metrics_report_the_sampled_resident_memory() -> None:
    metrics = Metrics()
    metrics.watch_process(lambda: 500 * MiB, lambda: 900 * MiB)
    registry = metrics.registry
    assert registry.get_sample_value("hapi_process_resident_bytes") == 500 * MiB
    assert registry.get_sample_value("hapi_process_resident_peak_bytes") == 900 * MiB


def test_memory_malloc_holds_free_for_reuse_is_not_counted_as_in_use() -> None:
    # 900 MiB resident, 600 of them freed blocks glibc keeps: the next request reuses those.
    assert resident_in_use_bytes(lambda: 900 * MiB, lambda: 600 * MiB) == 300 * MiB
    assert resident_in_use_bytes(lambda: 900 * MiB, None) == 900 * MiB  # not glibc: all of it
    assert resident_in_use_bytes(lambda: 0, lambda: 5 * MiB) == 0  # no /proc
