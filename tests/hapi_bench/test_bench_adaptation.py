"""The adaptation and tenants scenarios' own parts: grids, the VmData poller, budget shares."""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hapi_bench.scenario_adaptation import _DataPeak, _PlannedPeak, _share, _status_field
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
        # A private mapping of its own: VmData grows at once. A bytearray may come from memory
        # malloc already holds (the worker's earlier tests freed it) and VmData does not move;
        # a shared mapping (mmap's default) is not counted in VmData at all.
        block = mmap.mmap(-1, 64 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        deadline = time.monotonic() + 30
        while peak.peak < idle + 64 * MiB and time.monotonic() < deadline:
            time.sleep(0.001)
        block.close()
    assert peak.peak >= idle + 64 * MiB


def test_shares_of_the_budget() -> None:
    assert _share(None, 100) is None
    assert _share(905, 1000) == 90.5


class _Gauge(BaseHTTPRequestHandler):
    """A /metrics page whose planned-memory gauge steps through ``values`` (a fake server)."""

    values: list[float] = []
    served = 0

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's handler name
        cls = type(self)
        value = cls.values[min(cls.served, len(cls.values) - 1)]
        cls.served += 1
        body = (
            "# TYPE hapi_planned_memory_bytes gauge\n"
            f'hapi_planned_memory_bytes{{device="cpu"}} {value}\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gauge_url() -> Iterator[str]:
    _Gauge.values, _Gauge.served = [0.0, 300.0, 900.0, 100.0, 0.0], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gauge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_planned_poller_keeps_the_highest_plan(gauge_url: str) -> None:
    with _PlannedPeak(gauge_url, interval_s=0.001) as planned:
        deadline = time.monotonic() + 30
        while _Gauge.served < len(_Gauge.values) and time.monotonic() < deadline:
            time.sleep(0.001)
    assert planned.peak == 900.0
