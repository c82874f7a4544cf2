"""The shared feature store: its key, byte bound and LRU eviction, a failing directory,
coalescing's ownership rules and re-framing at a request's own COS batch size (unit tests)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from hapi_contract import Compression, OutputDtype
from hapi_contract.frames import BatchFrame, FrameDecoder, FrameEncoder
from hapi_core.metrics import Metrics
from hapi_core.settings import CoreSettings
from hapi_core.shared_features import (
    Computation,
    FeatureKey,
    FeatureStore,
    Joined,
    RecordingEncoder,
    SharedFeatures,
    reframe,
)
from hapi_core.store_directory import LOCK_NAME


def key(shard: str = "AUTH_a/data/s0.tar", etag: str = "e1", sha: str = "f" * 64) -> FeatureKey:
    return FeatureKey(
        shard=shard,
        shard_etag=etag,
        layout="shards",
        label_field=None,
        num_classes=3,
        weights="AUTH_a/models/m.safetensors",
        weights_etag="w1",
        sha256=sha,
        arch="alexnet",
        split=3,
        transform='{"crop": 32}',
        dtype="float16",
    )


def features(n: int, width: int = 8, seed: int = 0) -> SharedFeatures:
    g = torch.Generator().manual_seed(seed)
    return SharedFeatures(
        torch.randn(n, width, generator=g).to(torch.float16), torch.arange(n, dtype=torch.int64)
    )


def stored(store: FeatureStore, k: FeatureKey) -> SharedFeatures:
    found = store.begin(k)
    assert isinstance(found, SharedFeatures), found
    return found


def test_a_miss_leads_then_a_second_request_joins_then_a_third_hits() -> None:
    metrics = Metrics()
    store = FeatureStore(1 << 20, None, metrics)
    lead = store.begin(key())
    assert isinstance(lead, Computation)
    joined = store.begin(key())
    assert isinstance(joined, Joined) and joined.computation is lead
    woken: list[bool] = []
    leave = lead.on_settled(lambda: woken.append(True))
    store.settle(lead, features(5))
    leave()
    assert woken == [True]
    assert lead.outcome() is not None
    assert torch.equal(stored(store, key()).features, features(5).features)
    assert metrics.feature_store_misses._value.get() == 1
    assert metrics.feature_store_coalesced._value.get() == 1
    assert metrics.feature_store_hits._value.get() == 1
    assert metrics.feature_store_bytes._value.get() == features(5).nbytes


def test_two_requests_arriving_together_compute_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first request is held right after it missed; the second, arriving then, must join
    its computation, not miss as well (a sweep's jobs ask for their first shard together)."""
    store = FeatureStore(1 << 20, None, Metrics())
    missed, second_done = threading.Event(), threading.Event()
    count = store._count

    def held_on_first_miss(what: str, amount: float = 1) -> None:
        count(what, amount)
        if what == "misses" and not missed.is_set():
            missed.set()
            second_done.wait(10)  # bounded: the second request's begin returns meanwhile

    monkeypatch.setattr(store, "_count", held_on_first_miss)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(store.begin, key())
        assert missed.wait(10)
        second = store.begin(key())
        second_done.set()
        lead = first.result(timeout=10)
    assert isinstance(lead, Computation)
    assert isinstance(second, Joined) and second.computation is lead


def test_a_request_arriving_as_the_computation_settles_does_not_compute_again() -> None:
    """Between waking the waiters and storing the result, the key stays joinable: a request
    then gets the result (a settled computation answers at once), not a miss."""
    store = FeatureStore(1 << 20, None, None)
    lead = store.begin(key())
    assert isinstance(lead, Computation)
    meanwhile: list[object] = []
    lead.on_settled(lambda: meanwhile.append(store.begin(key())))
    store.settle(lead, features(4))
    [found] = meanwhile
    assert isinstance(found, Joined) and found.computation.outcome() is not None
    assert isinstance(store.begin(key()), SharedFeatures)  # and stored once settled


def test_another_etag_weights_or_account_is_another_key() -> None:
    store = FeatureStore(1 << 20, None, None)
    lead = store.begin(key())
    assert isinstance(lead, Computation)
    store.settle(lead, features(5))
    for other in (key(etag="e2"), key(sha="0" * 64), key(shard="AUTH_b/data/s0.tar")):
        assert isinstance(store.begin(other), Computation)


def test_bound_in_bytes_evicts_least_recently_used() -> None:
    one = features(10).nbytes
    metrics = Metrics()
    store = FeatureStore(2 * one, None, metrics)
    a, b, c = key("AUTH_a/d/a"), key("AUTH_a/d/b"), key("AUTH_a/d/c")
    store.put(a, features(10))
    store.put(b, features(10))
    stored(store, a)  # a is now the most recently used: b goes first
    store.put(c, features(10))
    assert a in store and c in store and b not in store
    assert store.bytes == 2 * one <= store.capacity_bytes
    assert metrics.feature_store_evictions._value.get() == 1
    store.put(key("AUTH_a/d/huge"), features(100))  # larger than the whole store: not kept
    assert len(store) == 2 and store.bytes == 2 * one


def test_failed_computation_wakes_waiters_with_nothing_and_is_not_stored() -> None:
    store = FeatureStore(1 << 20, None, None)
    lead = store.begin(key())
    assert isinstance(lead, Computation)
    woken: list[object] = []
    lead.on_settled(lambda: woken.append(lead.outcome()))
    store.settle(lead, None)
    assert woken == [None]
    assert isinstance(store.begin(key()), Computation)  # computed again, not served


def test_computation_belongs_to_the_group() -> None:
    alone = Computation(key())
    alone.owner_left()
    assert alone.cancelled.is_set()

    shared = Computation(key())
    leave = shared.on_settled(lambda: None)
    shared.owner_left()
    assert not shared.cancelled.is_set()  # a joined request still wants it
    leave()
    assert shared.cancelled.is_set()  # nobody does now


def test_a_cancelled_computation_is_not_joined() -> None:
    store = FeatureStore(1 << 20, None, None)
    lead = store.begin(key())
    assert isinstance(lead, Computation)
    lead.owner_left()
    assert isinstance(store.begin(key()), Computation)


def test_directory_store_round_trips_files_and_evicts_them(tmp_path: Path) -> None:
    one = features(4).nbytes
    store = FeatureStore(one, tmp_path / "store", None)
    store.put(key("AUTH_a/d/a"), features(4, seed=1))
    assert torch.equal(stored(store, key("AUTH_a/d/a")).features, features(4, seed=1).features)
    assert len(list((tmp_path / "store").rglob("*.safetensors"))) == 1
    store.put(key("AUTH_a/d/b"), features(4, seed=2))
    files = list((tmp_path / "store").rglob("*.safetensors"))
    assert len(files) == 1 and files[0].name == key("AUTH_a/d/b").digest() + ".safetensors"


def test_unwritable_directory_degrades_to_no_store_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a directory")
    caplog.set_level(logging.WARNING, logger="hapi_core.shared_features")
    store = FeatureStore(1 << 20, blocker / "store", None)
    assert not store.enabled
    assert store.begin(key()) is None  # the request computes alone
    store.put(key(), features(3))
    assert len(store) == 0
    assert len([r for r in caplog.records if "without a feature store" in r.message]) == 1


def test_directory_removed_later_degrades_without_raising(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "store"
    store = FeatureStore(1 << 20, directory, None)
    store.put(key("AUTH_a/d/a"), features(3))
    shutil.rmtree(directory)
    directory.write_bytes(b"")  # a file where the directory was: every write fails
    caplog.set_level(logging.WARNING, logger="hapi_core.shared_features")
    store.put(key("AUTH_a/d/b"), features(3))
    store.put(key("AUTH_a/d/c"), features(3))
    assert not store.enabled and len(store) == 0
    assert len([r for r in caplog.records if "without a feature store" in r.message]) == 1


# A sibling process sharing the store's directory: it claims its subdirectory as a store does,
# leaves there an entry and the ``.part`` of a write in progress, and runs until killed.
_SIBLING = """
import sys
from pathlib import Path
from hapi_core.store_directory import claim
owned = claim(Path(sys.argv[1]))
(owned.path / "e.safetensors").write_bytes(b"x" * 100)
(owned.path / "tmp1234.part").write_bytes(b"x" * 50)
print(owned.path, flush=True)
sys.stdin.read()
"""


def test_a_killed_process_leftovers_go_when_a_store_starts_a_running_ones_stay(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    sibling = subprocess.Popen(
        [sys.executable, "-c", _SIBLING, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sibling.stdout is not None
        theirs = Path(sibling.stdout.readline().strip())
        assert theirs.parent == root, "the sibling did not start"
        FeatureStore(1 << 20, root, None)  # a server starting beside a running one
        assert sorted(p.name for p in theirs.iterdir()) == [
            "e.safetensors",
            LOCK_NAME,
            "tmp1234.part",
        ]
    finally:
        sibling.kill()
        sibling.wait(timeout=60)
    restarted = FeatureStore(1 << 20, root, None)
    assert restarted.enabled and not theirs.exists()
    assert not list(root.rglob("*.part")) and not list(root.rglob("e.safetensors"))


def test_a_running_sibling_keeps_its_entries_when_another_evicts_the_same_key(
    tmp_path: Path,
) -> None:
    """Two stores of one directory (two proxy workers) store the same key; one evicting it
    must not take the other's entry."""
    one = features(4).nbytes
    first = FeatureStore(one, tmp_path / "store", None)
    second = FeatureStore(one, tmp_path / "store", None)
    first.put(key("AUTH_a/d/a"), features(4, seed=1))
    second.put(key("AUTH_a/d/a"), features(4, seed=1))
    second.put(key("AUTH_a/d/b"), features(4, seed=2))  # evicts its own a
    FeatureStore(one, tmp_path / "store", None)  # a third starting meanwhile
    assert torch.equal(stored(first, key("AUTH_a/d/a")).features, features(4, seed=1).features)
    assert torch.equal(stored(second, key("AUTH_a/d/b")).features, features(4, seed=2).features)


def test_the_bound_holds_over_an_ended_process_leftovers_and_evicts_lru(tmp_path: Path) -> None:
    root = tmp_path / "store"
    one = features(4).nbytes
    ended = root / "4242-ended"  # what a killed process leaves: nobody holds its lock
    ended.mkdir(parents=True)
    (ended / LOCK_NAME).touch()
    (ended / f"{key('AUTH_a/d/z').digest()}.safetensors").write_bytes(b"x" * 2 * one)
    (ended / "tmp99.part").write_bytes(b"x" * one)
    foreign = root / "not-a-store"  # no lock file: not ours to remove
    foreign.mkdir()
    store = FeatureStore(2 * one, root, None)
    store.put(key("AUTH_a/d/a"), features(4, seed=1))
    store.put(key("AUTH_a/d/b"), features(4, seed=2))
    stored(store, key("AUTH_a/d/a"))  # a is now the most recently used
    store.put(key("AUTH_a/d/c"), features(4, seed=3))
    assert key("AUTH_a/d/a") in store and key("AUTH_a/d/c") in store
    assert key("AUTH_a/d/b") not in store
    assert not ended.exists() and foreign.is_dir()
    # What the directory holds is what the bound counts: this store's two entries, no more.
    assert sorted(p.name for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME) == sorted(
        f"{key(f'AUTH_a/d/{s}').digest()}.safetensors" for s in "ac"
    )
    assert store.bytes == 2 * one


def decode(frames: list[bytes]) -> list[BatchFrame]:
    decoder = FrameDecoder()
    out: list[BatchFrame] = []
    for frame in frames:
        out += [f for f in decoder.feed(frame) if isinstance(f, BatchFrame)]
    return out


def test_recorded_features_are_reframed_at_each_requests_batch_size() -> None:
    x = torch.randn(11, 4, 3)
    labels = torch.arange(11) % 3
    recorder = RecordingEncoder(count=11, dtype=OutputDtype.FLOAT16, compression=Compression.NONE)
    for start in range(0, 11, 4):  # the leading request's COS batch: 4
        recorder.batch(x[start : start + 4], labels[start : start + 4], offset=start)
    shared = recorder.collected()
    assert shared is not None and shared.count == 11
    for batch_size in (1, 5, 11, 50):
        encoder = FrameEncoder(dtype=OutputDtype.FLOAT16, compression=Compression.ZSTD)
        frames = decode(list(reframe(encoder, shared, batch_size)))
        assert [f.offset for f in frames] == list(range(0, 11, batch_size))
        assert all(f.count == min(batch_size, 11 - f.offset) for f in frames)
        got = torch.cat([f.features for f in frames])
        assert torch.equal(got, x.to(torch.float16))
        assert torch.cat([f.labels for f in frames]).tolist() == labels.tolist()


def test_recording_with_a_gap_shares_nothing() -> None:
    recorder = RecordingEncoder(count=8, dtype=OutputDtype.FLOAT32, compression=Compression.NONE)
    recorder.batch(torch.ones(4, 2), torch.zeros(4, dtype=torch.int64), offset=0)
    assert recorder.collected() is None  # a job that stopped early


def _record(store: FeatureStore, k: FeatureKey, x: torch.Tensor) -> RecordingEncoder:
    lead = store.begin(k)
    assert isinstance(lead, Computation)
    recorder = RecordingEncoder(
        count=x.shape[0], dtype=OutputDtype.FLOAT16, compression=Compression.NONE, computation=lead
    )
    for start in range(0, x.shape[0], 2):
        stop = min(x.shape[0], start + 2)
        recorder.batch(x[start:stop], torch.zeros(stop - start, dtype=torch.int64), offset=start)
    return recorder


def test_copies_in_flight_are_bounded_by_the_store_and_freed_when_settled() -> None:
    """The leading jobs' copies are outside the per-request plan: together they hold at most
    the store's bound, a job past it stops copying (its waiters compute their own), and the
    bytes go back once its computation is settled."""
    per_sample = 8 * 2 + 8  # float16 features of width 8 and an int64 label
    store = FeatureStore(10 * per_sample, None, None)
    first = _record(store, key("AUTH_a/d/a"), torch.randn(6, 8))
    assert store.recording.used == 6 * per_sample
    second = _record(store, key("AUTH_a/d/b"), torch.randn(6, 8))
    assert second.collected() is None  # 4 samples would have passed the bound
    assert store.recording.used == 6 * per_sample + 4 * per_sample
    assert first.collected() is not None

    lead_b = second._computation
    assert lead_b is not None
    store.settle(lead_b, None)
    assert store.recording.used == 6 * per_sample
    lead_a = first._computation
    assert lead_a is not None
    store.settle(lead_a, first.collected())
    assert store.recording.used == 0 and key("AUTH_a/d/a") in store


def test_an_entry_larger_than_the_store_is_not_copied_whole() -> None:
    per_sample = 8 * 2 + 8
    store = FeatureStore(3 * per_sample, None, None)
    recorder = _record(store, key(), torch.randn(8, 8))
    assert recorder.collected() is None and store.recording.used <= 3 * per_sample


def test_sharing_is_on_by_default_with_a_modest_bound() -> None:
    """A sweep shares without configuration: the server's store (and so coalescing) is on by
    default, bounded well inside the CPU device's default budget."""
    settings = CoreSettings()
    assert 0 < settings.feature_store_bytes
    # The store and the copies in flight, both outside the plan, within an eighth of the budget.
    assert 2 * settings.feature_store_bytes <= settings.cpu_memory_budget_bytes // 8
    assert FeatureStore(settings.feature_store_bytes, None, None).enabled
