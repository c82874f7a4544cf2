"""The bandwidth probe (``SwiftSession.read_prefix``) times the link as the epoch's streams are
timed: from the first chunk on, so the request's latency and a shaper's initial burst do not
read as link speed (unit test: a fake connection and clock; the real read runs against Swift in
``tests/hapi_client/planning/test_planning_link.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from swiftclient.client import ClientException

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


class _RangedConnection:
    """An object of ``size`` chunks whose ranged GETs return just their range: the first chunk
    ``latency_s`` after the request, then one every ``gap_s`` (the link's rate)."""

    def __init__(self, clock: _Clock, size: int, latency_s: float, gap_s: float) -> None:
        self.clock, self.size, self.latency_s, self.gap_s = clock, size, latency_s, gap_s
        self.ranges: list[tuple[float, int, int]] = []

    def get_object(
        self, container: str, name: str, headers: dict[str, str], **_: Any
    ) -> tuple[dict[str, str], Iterator[bytes]]:
        first, last = (int(v) for v in headers["Range"].removeprefix("bytes=").split("-"))
        if first >= self.size * CHUNK:
            raise ClientException("range not satisfiable", http_status=416)
        self.ranges.append((self.clock.now, first, last + 1))
        return {}, self._body(first, min(last + 1, self.size * CHUNK))

    def _body(self, first: int, end: int) -> Iterator[bytes]:
        for i, at in enumerate(range(first, end, CHUNK)):
            self.clock.now += self.latency_s if i == 0 else self.gap_s
            yield (at // CHUNK % 251).to_bytes() * min(CHUNK, end - at)


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


def test_the_probe_reads_whole_ranges_and_starts_none_after_its_time(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow link, 0.1 s a chunk: an 8 MiB range stopped after 0.5 s would leave most of it
    # queued in front of the plan's next request; whole ranges leave nothing.
    conn = _RangedConnection(clock, size=1000, latency_s=0.05, gap_s=0.1)
    session = _session(monkeypatch, conn)  # type: ignore[arg-type]
    began = clock.now
    rate, data = session.read_prefix("c", "o", 128 * CHUNK, max_seconds=0.5)
    starts = [at - began for at, _, _ in conn.ranges]
    assert all(at < 0.5 for at in starts)  # none started after the probe's time
    assert conn.ranges[0][1:] == (0, swift_session.PROBE_FIRST_BYTES)
    # Contiguous ranges, each read whole: the data is the object's prefix.
    assert [r[2] for r in conn.ranges[:-1]] == [r[1] for r in conn.ranges[1:]]
    assert len(data) == conn.ranges[-1][2]
    expected = b"".join((i % 251).to_bytes() * CHUNK for i in range(len(data) // CHUNK))
    assert data == expected
    assert clock.now - began < 0.5 + 0.2  # the last range sized to what the time left carries
    assert rate == pytest.approx(CHUNK / 0.1)  # each range timed from its first chunk


def test_the_probe_stops_at_the_object_s_end(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = _RangedConnection(clock, size=3, latency_s=0.01, gap_s=0.01)
    session = _session(monkeypatch, conn)  # type: ignore[arg-type]
    _, data = session.read_prefix("c", "o", 64 * CHUNK, max_seconds=10.0)
    assert len(data) == 3 * CHUNK  # 1 chunk, then 2 of the 2 asked for, then a 416: the end
