"""BandwidthEstimator: folding, smoothing and the override, fed with known transfers."""

from __future__ import annotations

import threading

import pytest

from hapi_client.bandwidth import BandwidthEstimator, StreamClock
from hapi_client.errors import ConfigurationError


def test_no_estimate_before_enough_bytes() -> None:
    est = BandwidthEstimator(min_bytes=1000)
    est.observe(400, 0.1)
    est.observe(400, 0.1)
    assert est.bytes_per_s is None and est.observations == 0


def test_small_transfers_are_folded_into_one_observation() -> None:
    est = BandwidthEstimator(min_bytes=1000)
    est.observe(400, 0.1)
    est.observe(600, 0.4)  # 1000 bytes in 0.5 s together
    assert est.observations == 1
    assert est.bytes_per_s == pytest.approx(2000.0)


def test_exponential_smoothing() -> None:
    est = BandwidthEstimator(alpha=0.25, min_bytes=1)
    est.observe(1000, 1.0)
    est.observe(5000, 1.0)
    assert est.bytes_per_s == pytest.approx(0.25 * 5000 + 0.75 * 1000)


def test_empty_or_instant_transfers_are_ignored() -> None:
    est = BandwidthEstimator(min_bytes=1)
    est.observe(0, 1.0)
    est.observe(100, 0.0)
    est.observe(-5, 1.0)
    assert est.bytes_per_s is None


def test_override_pins_the_estimate() -> None:
    est = BandwidthEstimator(override=123.0, min_bytes=1)
    est.observe(10_000, 1.0)
    assert est.bytes_per_s == 123.0


def test_drifted() -> None:
    est = BandwidthEstimator(min_bytes=1)
    assert not est.drifted(1000.0)  # no estimate yet
    est.observe(1300, 1.0)
    assert est.drifted(1000.0)  # 30 % > 25 %
    assert not est.drifted(1000.0, tolerance=0.5)


def test_concurrent_observations_count_every_byte() -> None:
    est = BandwidthEstimator(alpha=1.0, min_bytes=10**9)

    def feed() -> None:
        for _ in range(1000):
            est.observe(100, 0.001)

    threads = [threading.Thread(target=feed) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 400 kB pending: nothing lost to a race between the threads' read-modify-write.
    assert est._pending_bytes == 400_000
    assert est._pending_s == pytest.approx(4.0)


@pytest.mark.parametrize("kwargs", [{"alpha": 0.0}, {"alpha": 1.5}, {"override": 0.0}])
def test_bad_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        BandwidthEstimator(**kwargs)  # type: ignore[arg-type]


def test_a_streams_idle_pauses_are_not_the_links_time() -> None:
    """Two bursts of ten 64 kB chunks 1 ms apart (64 MB/s) with a 2 s pause between them (the
    server computing its next batch): the link's rate, not the stream's average."""
    clock = StreamClock()
    t = 0.0
    for burst in range(2):
        t += 2.0 if burst else 0.0  # the server's compute before the second burst
        for _ in range(10):
            clock.chunk(65_536, now=t)
            t += 0.001
    nbytes, seconds = clock.carried()
    assert nbytes == 18 * 65_536 and seconds == pytest.approx(0.018)
    est = BandwidthEstimator(min_bytes=1)
    clock.report(est)
    assert est.bytes_per_s == pytest.approx(65_536 / 0.001)


def test_a_slow_steady_stream_keeps_all_its_time() -> None:
    """At 5 Mbit/s every 64 kB chunk takes about 0.1 s: those are the link's, none is idle."""
    clock = StreamClock()
    for i in range(1, 6):
        clock.chunk(65_536, now=i * 0.105)
    assert clock.carried() == (4 * 65_536, pytest.approx(4 * 0.105))


def test_the_pauses_before_a_frame_are_the_senders_however_short() -> None:
    """Frames of 32 KB (COS batches of 32 small feature vectors) a compute pause of 0.16 s
    apart, each in four 8 KB chunks 12.5 ms apart on a 5 Mbit/s link: the pauses are the
    median gap, so only the frames' starts tell the link's time from the server's."""
    clock = StreamClock()
    t = 0.0
    for _ in range(10):
        for piece in range(4):
            clock.chunk(8_192, now=t, continues=piece > 0)
            t += 0.0125
        t += 0.16
    nbytes, seconds = clock.carried()
    assert nbytes == 10 * 3 * 8_192 and seconds == pytest.approx(10 * 3 * 0.0125)


def test_a_stream_of_one_chunk_tells_nothing() -> None:
    clock = StreamClock()
    clock.chunk(100)
    est = BandwidthEstimator(min_bytes=1)
    clock.report(est)
    assert clock.carried() == (0, 0.0) and est.bytes_per_s is None
