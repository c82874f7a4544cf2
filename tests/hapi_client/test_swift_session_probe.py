"""The bandwidth probe (``SwiftSession.read_prefix``) times the link as the epoch's streams are
timed: from the first chunk on, so the request's latency and a shaper's initial burst do not
read as link speed (unit test: a fake connection and clock; the real read runs against Swift in
``tests/hapi_client/planning/test_planning_link.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hapi_client import bandwidth, swift_session
from hapi_client.bandwidth import BandwidthEstimator
from hapi_client.swift_session import SwiftCredentials, SwiftSession

CHUNK = 1 << 16


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Connection:
    """A ranged GET whose first chunk comes ``latency_s`` after the request, then one chunk
    every ``gap_s``."""

    def __init__(self, clock: _Clock, chunks: int, latency_s: float, gap_s: float) -> None:
        self.clock, self.chunks, self.latency_s, self.gap_s = clock, chunks, latency_s, gap_s

    def get_object(self, container: str, name: str, **_: Any) -> tuple[dict[str, str], Any]:
        return {}, _Body(self)


class _Body:
    def __init__(self, conn: _Connection) -> None:
        self.conn = conn

    def __iter__(self) -> Iterator[bytes]:
        for i in range(self.conn.chunks):
            self.conn.clock.now += self.conn.latency_s if i == 0 else self.conn.gap_s
            yield bytes(CHUNK)

    def close(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(swift_session.time, "perf_counter", fake)
    monkeypatch.setattr(bandwidth.time, "perf_counter", fake)
    return fake


def _session(monkeypatch: pytest.MonkeyPatch, conn: _Connection) -> SwiftSession:
    session = SwiftSession(
        SwiftCredentials("http://swift.invalid/auth/v1.0"), BandwidthEstimator(min_bytes=1)
    )
    monkeypatch.setattr(session, "_conn", lambda: conn)
    return session


def test_the_probe_times_the_link_from_its_first_chunk(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0.3 s before the first chunk (latency, or a burst's worth of bytes), then 10 chunks at
    # 0.1 s each: the link carries 640 KiB/s.
    session = _session(monkeypatch, _Connection(clock, chunks=11, latency_s=0.3, gap_s=0.1))
    rate, data = session.read_prefix("c", "o", 11 * CHUNK, max_seconds=10.0)
    assert len(data) == 11 * CHUNK  # every byte read is handed back
    assert rate == pytest.approx(10 * CHUNK / 1.0)  # not 11 chunks over 1.3 s
    assert session.bandwidth is not None
    assert session.bandwidth.bytes_per_s == pytest.approx(rate)


def test_a_probe_of_one_chunk_is_timed_whole(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _session(monkeypatch, _Connection(clock, chunks=1, latency_s=0.5, gap_s=0.1))
    rate, data = session.read_prefix("c", "o", CHUNK)
    assert len(data) == CHUNK and rate == pytest.approx(CHUNK / 0.5)
