"""The kept head timings (``hapi_core.timing_cache``): settling, reuse, coverage, wire formats,
bounds."""

from __future__ import annotations

from hapi_core.timing_cache import SETTLE_MEASUREMENTS, LayerTimes, TimingKey

KEY: TimingKey = ("alexnet", 10, (3, 64, 64), "cpu")


def test_a_settled_head_answers_later_requests_for_as_many_layers_or_fewer() -> None:
    cache = LayerTimes.empty()
    assert cache.head(KEY, "float16", "zstd", 4) is None
    for _ in range(SETTLE_MEASUREMENTS):
        assert cache.head(KEY, "float16", "zstd", 4) is None  # not settled: measure again
        cache.record(
            KEY, "float16", "zstd", [1.0, 2.0, 3.0, 4.0], [0.1] * 4, [10.0, 20.0, 30.0, 40.0]
        )
    two = cache.head(KEY, "float16", "zstd", 2)
    assert two is not None and two.layer_s == [1.0, 2.0] and two.wire_bytes == [10.0, 20.0]
    assert cache.head(KEY, "float16", "zstd", 5) is None  # more layers than measured
    assert cache.head(KEY, "float32", "zstd", 2) is None  # another wire format: other sizes
    assert cache.head(("alexnet", 10, (3, 96, 96), "cpu"), "float16", "zstd", 2) is None
    assert (cache.hits, cache.measured) == (1, SETTLE_MEASUREMENTS)


def test_a_disturbed_first_measurement_is_not_what_is_kept() -> None:
    """A first measurement on a loaded host (three times the steady state) is not reused as
    it is: the measurements after it lower every time, layers and encodings alike."""
    cache = LayerTimes.empty()
    first = cache.record(KEY, "float32", "none", [3.0, 6.0], [0.3, 0.6], [8.0, 4.0])
    assert first.layer_s == [3.0, 6.0]
    assert cache.head(KEY, "float32", "none", 2) is None
    quiet = [([1.1, 2.0], [0.1, 0.25]), ([1.0, 2.2], [0.12, 0.2])]
    for i in range(SETTLE_MEASUREMENTS - 1):
        layer_s, encode_s = quiet[i % len(quiet)]
        cache.record(KEY, "float32", "none", layer_s, encode_s, [8.0, 4.0])
    kept = cache.head(KEY, "float32", "none", 2)
    assert kept is not None
    assert kept.layer_s == [1.0, 2.0] and kept.encode_s == [0.1, 0.2]
    assert (cache.hits, cache.measured) == (1, SETTLE_MEASUREMENTS)


def test_layers_measured_fewer_times_than_the_settle_count_are_measured_again() -> None:
    cache = LayerTimes.empty(settle=2)
    cache.record(KEY, "float16", "none", [1.0, 2.0, 3.0], [0.1] * 3, [1.0] * 3)
    cache.record(KEY, "float16", "none", [1.0], [0.1], [1.0])
    assert cache.head(KEY, "float16", "none", 1) is not None  # measured twice
    assert cache.head(KEY, "float16", "none", 2) is None  # layer 1 measured once only
    cache.record(KEY, "float16", "none", [1.0, 2.0, 3.0, 4.0], [0.1] * 4, [1.0] * 4)
    assert cache.head(KEY, "float16", "none", 3) is not None
    assert cache.head(KEY, "float16", "none", 4) is None


def test_a_shorter_measurement_keeps_the_longer_ones_later_layers() -> None:
    cache = LayerTimes.empty(settle=1)
    cache.record(KEY, "float16", "none", [1.0, 2.0, 3.0], [0.1, 0.2, 0.3], [1.0, 2.0, 3.0])
    got = cache.record(KEY, "float16", "none", [0.5], [0.05], [1.0])
    assert got.layer_s == [0.5]  # the fastest seen
    kept = cache.head(KEY, "float16", "none", 3)
    assert kept is not None and kept.layer_s == [0.5, 2.0, 3.0]
    assert kept.encode_s == [0.05, 0.2, 0.3]


def test_the_least_recently_used_head_goes_first() -> None:
    cache = LayerTimes.empty(max_heads=2, settle=1)
    for dtype in ("float16", "float32", "bfloat16"):
        cache.record(KEY, dtype, "none", [1.0], [0.1], [1.0])
    assert cache.head(KEY, "float16", "none", 1) is None
    assert cache.head(KEY, "bfloat16", "none", 1) is not None
