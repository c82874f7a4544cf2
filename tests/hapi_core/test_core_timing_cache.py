"""The kept head timings (``hapi_core.timing_cache``): reuse, coverage, wire formats, bounds."""

from __future__ import annotations

from hapi_core.timing_cache import LayerTimes, TimingKey

KEY: TimingKey = ("alexnet", 10, (3, 64, 64), "cpu")


def test_a_measured_head_answers_later_requests_for_as_many_layers_or_fewer() -> None:
    cache = LayerTimes.empty()
    assert cache.head(KEY, "float16", "zstd", 4) is None
    cache.record(KEY, "float16", "zstd", [1.0, 2.0, 3.0, 4.0], [0.1] * 4, [10.0, 20.0, 30.0, 40.0])
    two = cache.head(KEY, "float16", "zstd", 2)
    assert two is not None and two.layer_s == [1.0, 2.0] and two.wire_bytes == [10.0, 20.0]
    assert cache.head(KEY, "float16", "zstd", 5) is None  # more layers than measured
    assert cache.head(KEY, "float32", "zstd", 2) is None  # another wire format: other sizes
    assert cache.head(("alexnet", 10, (3, 96, 96), "cpu"), "float16", "zstd", 2) is None
    assert (cache.hits, cache.measured) == (1, 1)


def test_a_shorter_measurement_keeps_the_longer_ones_later_layers() -> None:
    cache = LayerTimes.empty()
    cache.record(KEY, "float16", "none", [1.0, 2.0, 3.0], [0.1, 0.2, 0.3], [1.0, 2.0, 3.0])
    got = cache.record(KEY, "float16", "none", [0.5], [0.05], [1.0])
    assert got.layer_s == [0.5]  # the fastest seen
    kept = cache.head(KEY, "float16", "none", 3)
    assert kept is not None and kept.layer_s == [0.5, 2.0, 3.0]
    assert kept.encode_s == [0.05, 0.2, 0.3]


def test_the_least_recently_used_head_goes_first() -> None:
    cache = LayerTimes.empty(max_heads=2)
    for dtype in ("float16", "float32", "bfloat16"):
        cache.record(KEY, dtype, "none", [1.0], [0.1], [1.0])
    assert cache.head(KEY, "float16", "none", 1) is None
    assert cache.head(KEY, "bfloat16", "none", 1) is not None


def test_a_heavy_head_is_timed_over_fewer_images() -> None:
    from hapi_core.timing import timed_samples

    assert timed_samples(None, 16) == 16  # unknown cost: every image
    assert timed_samples(0.01, 16) == 16
    assert timed_samples(0.25, 16) == 4  # a timed pass of about a second
    assert timed_samples(1.5, 16) == 2  # never fewer than two
    assert timed_samples(1.5, 1) == 1
