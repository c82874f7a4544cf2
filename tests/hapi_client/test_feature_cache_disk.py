"""DiskFeatureCache: survives the process, byte cap with LRU eviction, damaged files refetched,
several processes sharing one directory."""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path

import pytest
import torch

from hapi_client import ConfigurationError, DiskFeatureCache, FeatureCache
from hapi_client.feature_cache import CachedFeatures, CacheKey


def entry(rows: int, value: float = 1.0, dim: int = 4) -> CachedFeatures:
    features = torch.arange(rows * dim, dtype=torch.float32).reshape(rows, dim) * value
    return CachedFeatures(features, torch.arange(rows, dtype=torch.int64))


def key(etag: str, split: int = 3, dtype: str = "float32") -> CacheKey:
    return FeatureCache.key(etag, "sha", split, '{"resize":256}', dtype)


def file_size(cache: DiskFeatureCache, k: CacheKey) -> int:
    return cache.path_for(k).stat().st_size


def test_a_new_cache_on_the_same_directory_finds_the_features(tmp_path: Path) -> None:
    first = DiskFeatureCache(tmp_path)
    first.put(key("a"), entry(5, 2.0))
    again = DiskFeatureCache(tmp_path)  # a restarted process: empty memory, same disk
    got = again.get(key("a"))
    assert got is not None
    assert torch.equal(got.features, entry(5, 2.0).features)
    assert torch.equal(got.labels, entry(5).labels)
    assert (again.hits, again.disk_hits, again.misses) == (1, 1, 0)
    assert again.get(key("a")) is not None and again.disk_hits == 1  # now from memory


def test_every_key_part_names_another_file(tmp_path: Path) -> None:
    cache = DiskFeatureCache(tmp_path)
    cache.put(key("a"), entry(2))
    fresh = DiskFeatureCache(tmp_path)
    assert fresh.get(key("a", split=4)) is None
    assert fresh.get(key("a", dtype="float16")) is None
    assert fresh.get(FeatureCache.key("a", "other-sha", 3, '{"resize":256}', "float32")) is None
    assert fresh.misses == 3


def test_the_directory_stays_under_its_cap_least_recently_used_first(tmp_path: Path) -> None:
    probe = DiskFeatureCache(tmp_path / "probe")
    probe.put(key("x"), entry(10))
    size = file_size(probe, key("x"))
    cache = DiskFeatureCache(tmp_path / "c", max_bytes=2 * size, memory_bytes=1)
    cache.put(key("a"), entry(10))
    cache.put(key("b"), entry(10))
    # Make "a" the most recently used without depending on the clock's resolution.
    os.utime(cache.path_for(key("b")), (1, 1))
    assert cache.get(key("a")) is not None
    cache.put(key("c"), entry(10))
    assert cache.disk_bytes <= 2 * size
    assert not cache.path_for(key("b")).exists()
    assert cache.path_for(key("a")).exists() and cache.path_for(key("c")).exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_file_is_a_miss_and_is_written_again(tmp_path: Path, damage: str) -> None:
    DiskFeatureCache(tmp_path).put(key("a"), entry(8))
    path = DiskFeatureCache(tmp_path).path_for(key("a"))
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flip":
        data[-3] ^= 0xFF  # inside the last tensor's bytes: only the sha256 notices
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(b"not a safetensors file")
    cache = DiskFeatureCache(tmp_path)
    assert cache.get(key("a")) is None
    assert cache.corrupt == 1 and not path.exists()
    cache.put(key("a"), entry(8))
    assert DiskFeatureCache(tmp_path).get(key("a")) is not None


def test_a_file_holding_another_key_is_not_served(tmp_path: Path) -> None:
    cache = DiskFeatureCache(tmp_path)
    cache.put(key("a"), entry(3))
    cache.path_for(key("a")).rename(cache.path_for(key("b")))  # as if two keys' hashes met
    fresh = DiskFeatureCache(tmp_path)
    assert fresh.get(key("b")) is None and fresh.corrupt == 1


def test_an_unwritable_directory_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigurationError, match="feature cache"):
        DiskFeatureCache(blocker / "cache")
    with pytest.raises(ConfigurationError, match="max_bytes"):
        DiskFeatureCache(tmp_path, max_bytes=0)


def test_a_failed_write_keeps_the_features_in_memory(tmp_path: Path) -> None:
    cache = DiskFeatureCache(tmp_path / "c")
    shutil.rmtree(tmp_path / "c")  # the disk went away under the run (works as root too)
    cache.put(key("a"), entry(3))
    assert cache.get(key("a")) is not None and cache.disk_hits == 0


def _writer(directory: str, worker: int, rounds: int) -> None:
    cache = DiskFeatureCache(directory, max_bytes=6 * 600, memory_bytes=1)
    for i in range(rounds):
        k = key(f"s{(worker + i) % 9}")
        got = cache.get(k)
        if got is not None:
            expected = entry(10, float((worker + i) % 9 + 1))
            assert torch.equal(got.features, expected.features)
        else:
            cache.put(k, entry(10, float((worker + i) % 9 + 1)))


def test_processes_sharing_a_directory_only_ever_read_whole_files(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 40)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    cache = DiskFeatureCache(tmp_path, max_bytes=6 * 600)
    assert cache.corrupt == 0
    assert not list(tmp_path.glob(".tmp-*"))
    for i in range(9):
        got = cache.get(key(f"s{i}"))
        assert got is None or torch.equal(got.features, entry(10, float(i + 1)).features)
    assert cache.corrupt == 0


def test_an_entry_above_the_cap_is_logged_once_and_kept_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 28, case 12: it was skipped without a word.
    cache = DiskFeatureCache(tmp_path, max_bytes=100)
    with caplog.at_level("WARNING", logger="hapi_client.feature_store"):
        cache.put(key("a"), entry(50))
        cache.put(key("b"), entry(50))
    warnings = [r.getMessage() for r in caplog.records if "above the disk cap" in r.getMessage()]
    assert len(warnings) == 1 and "100 bytes" in warnings[0]
    assert cache.too_large == 2 and not list(tmp_path.glob("*.safetensors"))
    assert cache.get(key("a")) is not None
