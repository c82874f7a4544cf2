"""FeatureCache: keyed lookups, LRU eviction bounded in bytes, counters."""

from __future__ import annotations

import torch

from hapi_client.feature_cache import CachedFeatures, FeatureCache


def entry(rows: int, dim: int = 4) -> CachedFeatures:
    # float32 features (4 bytes) plus int64 labels (8 bytes) per row
    return CachedFeatures(torch.zeros(rows, dim), torch.zeros(rows, dtype=torch.int64))


def key(etag: str, split: int = 3) -> tuple[str, str, int, str, str]:
    return FeatureCache.key(etag, "sha", split, "resize=256,crop=224", "float32")


def test_entry_size_counts_features_and_labels() -> None:
    assert entry(10).nbytes == 10 * 4 * 4 + 10 * 8


def test_hit_and_miss_counters() -> None:
    cache = FeatureCache()
    assert cache.get(key("a")) is None
    cache.put(key("a"), entry(2))
    got = cache.get(key("a"))
    assert got is not None and got.features.shape == (2, 4)
    assert (cache.hits, cache.misses) == (1, 1)


def test_every_key_part_matters() -> None:
    cache = FeatureCache()
    cache.put(key("a", split=3), entry(2))
    assert cache.get(key("a", split=4)) is None
    assert cache.get(FeatureCache.key("a", "sha", 3, "resize=256,crop=224", "float16")) is None


def test_least_recently_used_is_evicted_first() -> None:
    size = entry(10).nbytes
    cache = FeatureCache(max_bytes=2 * size)
    cache.put(key("a"), entry(10))
    cache.put(key("b"), entry(10))
    assert cache.get(key("a")) is not None  # a is now the most recent
    cache.put(key("c"), entry(10))
    assert cache.get(key("b")) is None
    assert cache.get(key("a")) is not None and cache.get(key("c")) is not None


def test_replacing_a_key_does_not_double_count() -> None:
    size = entry(10).nbytes
    cache = FeatureCache(max_bytes=2 * size)
    cache.put(key("a"), entry(10))
    cache.put(key("a"), entry(10))
    cache.put(key("b"), entry(10))
    assert cache.get(key("a")) is not None and cache.get(key("b")) is not None


def test_an_entry_larger_than_the_cache_is_not_kept() -> None:
    cache = FeatureCache(max_bytes=entry(10).nbytes - 1)
    cache.put(key("a"), entry(10))
    assert cache.get(key("a")) is None


def test_clear() -> None:
    cache = FeatureCache()
    cache.put(key("a"), entry(2))
    cache.clear()
    assert cache.get(key("a")) is None
