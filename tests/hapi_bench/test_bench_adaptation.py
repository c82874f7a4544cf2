"""The adaptation and tenants scenarios' own parts: grids, the VmData poller, budget shares."""

from __future__ import annotations

import os
import time

from hapi_bench.scenario_adaptation import _DataPeak, _share, _status_field
from hapi_bench.scenario_tenants import FULL_COUNTS, QUICK_COUNTS

MiB = 2**20


def test_both_tenant_grids_reach_the_thesis_point_of_ten_jobs() -> None:
    assert QUICK_COUNTS[0] == 1 and QUICK_COUNTS[-1] == 10
    assert list(QUICK_COUNTS) == sorted(set(QUICK_COUNTS))
    assert FULL_COUNTS == tuple(range(1, 11))


def test_the_poller_sees_a_block_while_it_is_allocated() -> None:
    pid = os.getpid()
    idle = _status_field(pid, "VmData")
    with _DataPeak(pid, interval_s=0.001) as peak:
        block = bytearray(64 * MiB)  # one mmap'd block: VmData grows at once
        deadline = time.monotonic() + 30
        while peak.peak < idle + 64 * MiB and time.monotonic() < deadline:
            time.sleep(0.001)
        del block
    assert peak.peak >= idle + 64 * MiB


def test_shares_of_the_budget() -> None:
    assert _share(None, 100) is None
    assert _share(905, 1000) == 90.5
