"""TokenBucket with a fake clock: the arithmetic of the throttle, with no real waiting."""

from __future__ import annotations

import pytest

from hapi_client.errors import ConfigurationError
from hapi_client.throttle import TokenBucket


class FakeClock:
    """A monotonic clock that only moves when the bucket sleeps or the test advances it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def bucket(rate: float, burst: int | None = None) -> tuple[TokenBucket, FakeClock]:
    clock = FakeClock()
    return TokenBucket(rate, burst, clock=clock, sleep=clock.sleep), clock


def test_a_burst_passes_without_sleeping() -> None:
    tb, clock = bucket(1000.0, burst=500)
    tb.consume(300)
    tb.consume(200)
    assert clock.slept == []


def test_the_deficit_is_slept_at_the_rate() -> None:
    tb, clock = bucket(1000.0, burst=500)
    tb.consume(500)
    tb.consume(250)  # 250 bytes beyond an empty bucket at 1000 B/s: a quarter of a second
    assert clock.slept == [pytest.approx(0.25)]


def test_long_run_rate_is_the_configured_rate() -> None:
    tb, clock = bucket(10_000.0, burst=1000)
    start = clock.now
    for _ in range(100):
        tb.consume(1000)
    # 100 kB at 10 kB/s, less the burst that was available at the start.
    assert clock.now - start == pytest.approx((100_000 - 1000) / 10_000.0)


def test_idle_time_refills_up_to_the_burst_only() -> None:
    tb, clock = bucket(1000.0, burst=500)
    tb.consume(500)
    clock.now += 60.0  # a long pause earns at most one burst, not 60 s worth of bytes
    tb.consume(500)
    assert clock.slept == []
    tb.consume(100)
    assert clock.slept == [pytest.approx(0.1)]


def test_default_burst_is_20_ms_capped_at_256_kib() -> None:
    assert TokenBucket(1_000_000.0).burst == pytest.approx(20_000.0)
    assert TokenBucket(1e9).burst == 256 * 1024


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_rate_must_be_positive(rate: float) -> None:
    with pytest.raises(ConfigurationError):
        TokenBucket(rate)
