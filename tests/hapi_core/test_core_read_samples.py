"""The core's read of a shard in every layout, driven by ``run_blocking`` over fake objects.

The flow is the one both hosts run (:func:`hapi_core.read_samples`); here its effects are
performed by a dict of objects, and the folder part's images by threads that a
:class:`~hapi_core.ReadWindow` drives, as the two real hosts drive it with their own concurrency.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from types import SimpleNamespace
from typing import Any, cast

import pytest
from PIL import Image

from hapi_contract import DatasetLayout, PartEntry, ShardSource, md5_hex, write_part, write_shard
from hapi_core import (
    Compute,
    CoreRuntime,
    CoreSettings,
    Effect,
    Get,
    GetMany,
    Head,
    InvalidShardError,
    NotFoundError,
    ObjectChangedError,
    ObjectInfo,
    PayloadTooLargeError,
    ReadWindow,
    StoredObject,
    read_samples,
    run_blocking,
)
from tests.in_place_data import webdataset_tar

INDEX, DATA, PART = "index", "images", "hapi-index/part-000000.jsonl"


def _jpeg(value: int, side: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (value, 255 - value, 7)).save(buf, format="JPEG")
    return buf.getvalue()


IMAGES = [_jpeg(40 * i) for i in range(5)]
LABELS = [0, 1, 2, 0, 1]
NAMES = [f"img/{i}.jpg" for i in range(5)]


def _part(images: list[bytes] = IMAGES, names: list[str] = NAMES) -> bytes:
    return write_part(
        PartEntry(name=n, etag=md5_hex(b), bytes=len(b), label=lab)
        for n, b, lab in zip(names, images, LABELS, strict=True)
    )


def _get_many_in_threads(
    effect: GetMany, get: Callable[[Get], StoredObject], pool: ThreadPoolExecutor
) -> list[StoredObject]:
    """The fake host's ``GetMany``: reads in ``pool``'s threads, as the window says."""
    window = ReadWindow(effect)
    running: dict[Future[StoredObject], int] = {}
    while window.open:
        for index in window.to_start():
            read = Get(effect.container, effect.objs[index], effect.max_bytes_each)
            running[pool.submit(get, read)] = index
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            error = future.exception()
            window.finished(running.pop(future), future.result() if error is None else error)
    return window.result()


class Store:
    """Objects by (container, name); counts the reads and performs the core's effects."""

    def __init__(self, objects: dict[tuple[str, str], bytes], pool: ThreadPoolExecutor) -> None:
        self.objects = objects
        self.pool = pool
        self.reads: list[str] = []
        self.get_many: list[GetMany] = []
        self._lock = threading.Lock()

    def get(self, effect: Get) -> StoredObject:
        with self._lock:
            self.reads.append(f"tail {effect.obj}" if effect.tail else effect.obj)
        try:
            data = self.objects[(effect.container, effect.obj)]
        except KeyError:
            raise NotFoundError(
                f"{effect.container}/{effect.obj} not found in Swift (404)"
            ) from None
        if effect.tail:
            data = data[-effect.tail :]
        if len(data) > effect.max_bytes:
            raise PayloadTooLargeError(f"{effect.container}/{effect.obj} is over the limit")
        return StoredObject(data, md5_hex(data))

    def perform(self, effect: Effect) -> Any:
        match effect:
            case Head(container, obj):
                data = self.objects[(container, obj)]
                self.reads.append(f"HEAD {obj}")
                return ObjectInfo(md5_hex(data), len(data))
            case Get():
                return self.get(effect)
            case GetMany():
                self.get_many.append(effect)
                return _get_many_in_threads(effect, self.get, self.pool)
            case Compute(work):
                return work()
        raise AssertionError(effect)


@pytest.fixture
def pool() -> Any:
    with ThreadPoolExecutor(8) as executor:
        yield executor


def _runtime(**settings: Any) -> CoreRuntime:
    return cast(CoreRuntime, SimpleNamespace(settings=CoreSettings(**settings)))


def _read(
    store: Store, source: ShardSource, num_classes: int = 3, **settings: Any
) -> tuple[list[bytes], list[int]]:
    return run_blocking(read_samples(_runtime(**settings), source, num_classes), store.perform)


FOLDER = ShardSource(INDEX, PART, DatasetLayout.FOLDER, data_container=DATA)


def _folder_store(pool: ThreadPoolExecutor, **changes: bytes) -> Store:
    objects = {(INDEX, PART): _part()}
    objects.update({(DATA, n): b for n, b in zip(NAMES, IMAGES, strict=True)})
    objects.update({(DATA, n): b for n, b in changes.items()})
    return Store(objects, pool)


def test_a_folder_part_reads_its_images_in_order_with_bounded_concurrency(
    pool: ThreadPoolExecutor,
) -> None:
    store = _folder_store(pool)
    images, labels = _read(store, FOLDER, object_read_concurrency=3)
    assert images == IMAGES and labels == LABELS
    assert store.reads[0] == PART and sorted(store.reads[1:]) == sorted(NAMES)
    (many,) = store.get_many
    assert many == GetMany(DATA, tuple(NAMES), CoreSettings().max_image_bytes, 3)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (_jpeg(200), "changed after it was indexed"),  # overwritten by another image
        (b"", "changed after it was indexed"),  # emptied
        (IMAGES[1] + b"\0", "changed after it was indexed"),  # one byte more
    ],
)
def test_an_image_that_is_not_what_was_indexed_is_a_409_naming_it(
    change: bytes, words: str, pool: ThreadPoolExecutor
) -> None:
    store = _folder_store(pool, **{NAMES[1]: change})
    with pytest.raises(ObjectChangedError, match=words) as refused:
        _read(store, FOLDER)
    assert refused.value.status == 409 and f"{DATA}/{NAMES[1]}" in refused.value.detail


def test_a_deleted_image_is_a_409_naming_it(pool: ThreadPoolExecutor) -> None:
    store = _folder_store(pool)
    del store.objects[(DATA, NAMES[2])]
    with pytest.raises(ObjectChangedError, match="deleted after the dataset was indexed") as e:
        _read(store, FOLDER)
    assert f"{DATA}/{NAMES[2]}" in e.value.detail


def test_an_object_that_is_not_an_image_is_a_422_naming_it(pool: ThreadPoolExecutor) -> None:
    text = b"not an image at all" * 3
    images = [IMAGES[0], text, *IMAGES[2:]]
    store = Store({(INDEX, PART): _part(images)}, pool)
    store.objects.update({(DATA, n): b for n, b in zip(NAMES, images, strict=True)})
    with pytest.raises(InvalidShardError, match=f"{DATA}/{NAMES[1]}: not the image"):
        _read(store, FOLDER)


def test_an_image_whose_header_is_over_the_pixel_limit_is_a_413_naming_it(
    pool: ThreadPoolExecutor,
) -> None:
    images = [*IMAGES[:4], _jpeg(3, side=64)]
    store = Store({(INDEX, PART): _part(images)}, pool)
    store.objects.update({(DATA, n): b for n, b in zip(NAMES, images, strict=True)})
    with pytest.raises(PayloadTooLargeError, match=f"{DATA}/{NAMES[4]}: 4096 pixels"):
        _read(store, FOLDER, max_image_pixels=1000)


def test_a_part_over_the_limits_is_refused_before_any_image_is_read(
    pool: ThreadPoolExecutor,
) -> None:
    store = _folder_store(pool)
    with pytest.raises(PayloadTooLargeError, match="5 samples, more than 4"):
        _read(store, FOLDER, max_samples_per_request=4)
    total = sum(map(len, IMAGES))
    with pytest.raises(PayloadTooLargeError, match=f"its images take {total} bytes"):
        _read(store, FOLDER, max_object_bytes=max(1024, total - 1))
    assert store.reads == [PART, PART] and not store.get_many


def test_a_malformed_part_is_a_422_naming_the_line(pool: ThreadPoolExecutor) -> None:
    store = Store({(INDEX, PART): _part() + b"{not json}\n"}, pool)
    with pytest.raises(InvalidShardError, match=f"{INDEX}/{PART} line 6"):
        _read(store, FOLDER)


def test_a_webdataset_tar_and_an_uploaded_shard_read_alike(pool: ThreadPoolExecutor) -> None:
    tar = webdataset_tar(IMAGES, LABELS, label_field="y")
    shard = write_shard(
        (f"s{i}", b, "jpg", lab) for i, (b, lab) in enumerate(zip(IMAGES, LABELS, strict=True))
    )
    store = Store({(DATA, "a.tar"): tar, (INDEX, "s.tar"): shard}, pool)
    wds = ShardSource(DATA, "a.tar", DatasetLayout.WEBDATASET, label_field="y")
    assert _read(store, wds) == (IMAGES, LABELS) == _read(store, ShardSource(INDEX, "s.tar"))
    with pytest.raises(PayloadTooLargeError, match="5 samples, more than 4"):
        _read(store, wds, max_samples_per_request=4)
    with pytest.raises(InvalidShardError, match="label 2 out of range"):
        _read(store, wds, num_classes=2)


def _blocking_get(
    concurrency: int, fail: str | None = None
) -> tuple[Callable[[Get], StoredObject], list[int], list[str]]:
    """A get that holds each read until ``concurrency`` are in flight together (a barrier: a
    bound below it would hang, not pass), recording the most in flight at once."""
    barrier = threading.Barrier(concurrency, timeout=30)
    lock = threading.Lock()
    state = {"now": 0}
    most: list[int] = [0]
    started: list[str] = []

    def get(effect: Get) -> StoredObject:
        with lock:
            started.append(effect.obj)
            state["now"] += 1
            most[0] = max(most[0], state["now"])
        try:
            if effect.obj == fail:
                raise NotFoundError(f"{effect.obj} not found")
            if fail is None:
                barrier.wait()
            return StoredObject(effect.obj.encode(), "")
        finally:
            with lock:
                state["now"] -= 1

    return get, most, started


def test_a_read_window_keeps_order_and_never_exceeds_its_concurrency() -> None:
    names = tuple(f"o{i}" for i in range(12))
    get, most, _ = _blocking_get(4)
    with ThreadPoolExecutor(8) as pool:
        got = _get_many_in_threads(GetMany("c", names, 10, 4), get, pool)
    assert [o.data.decode() for o in got] == list(names)
    assert most[0] == 4


def test_a_read_window_starts_nothing_after_a_refusal_and_raises_it_once_the_others_end() -> None:
    window = ReadWindow(GetMany("c", tuple(f"o{i}" for i in range(5)), 10, 2))
    assert list(window.to_start()) == [0, 1]
    window.finished(1, StoredObject(b"1", ""))
    assert list(window.to_start()) == [2]
    window.finished(0, NotFoundError("o0 not found"))
    assert list(window.to_start()) == [] and window.open  # read 2 is still in flight
    with pytest.raises(RuntimeError, match="not all finished"):
        window.result()
    window.finished(2, StoredObject(b"2", ""))
    assert not window.open
    with pytest.raises(NotFoundError, match="o0"):
        window.result()


def test_a_read_window_gives_the_objects_in_order_whatever_order_they_end_in() -> None:
    window = ReadWindow(GetMany("c", ("a", "b", "c"), 10, 8))
    assert list(window.to_start()) == [0, 1, 2]
    for index in (2, 0, 1):
        window.finished(index, StoredObject("abc"[index].encode(), ""))
    assert [o.data for o in window.result()] == [b"a", b"b", b"c"]


@pytest.mark.parametrize("layout", list(DatasetLayout))
def test_a_shard_overwritten_since_its_manifest_pinned_it_is_a_409_naming_it(
    pool: ThreadPoolExecutor, layout: DatasetLayout
) -> None:
    # The same samples in another order: as many as recorded, only the etag tells the change.
    swapped = IMAGES[::-1]
    if layout is DatasetLayout.FOLDER:
        container, name, before, after = INDEX, PART, _part(), _part(swapped, NAMES[::-1])
        source = dict(data_container=DATA)
    elif layout is DatasetLayout.WEBDATASET:
        container, name = DATA, "a.tar"
        before = webdataset_tar(IMAGES, LABELS, label_field="y")
        after = webdataset_tar(swapped, LABELS, label_field="y")
        source = dict(label_field="y")
    else:
        container, name = INDEX, "s.tar"
        before, after = (
            write_shard(
                (f"s{i}", b, "jpg", lab) for i, (b, lab) in enumerate(zip(ims, LABELS, strict=True))
            )
            for ims in (IMAGES, swapped)
        )
        source = {}
    pinned = ShardSource(container, name, layout, etag=md5_hex(before), **source)
    images = {(DATA, n): b for n, b in zip(NAMES, IMAGES, strict=True)}
    assert _read(Store({(container, name): before, **images}, pool), pinned)[0] == IMAGES
    store = Store({(container, name): after, **images}, pool)
    made = "uploaded" if layout is DatasetLayout.SHARDS else "indexed"
    with pytest.raises(ObjectChangedError, match=f"{container}/{name} changed after it was {made}"):
        _read(store, pinned)
    assert store.reads == [name]  # refused before anything else is read or parsed
    # Unpinned (a request written before pins existed), the stored shard is read as it is.
    assert len(_read(store, dataclasses.replace(pinned, etag=None))[0]) == len(IMAGES)


# --- Every byte read is planned before it is read ------------------------------------------------


def _read_planned(store: Store, source: ShardSource) -> tuple[list[bytes], list[int]]:
    """:func:`_read` with a ``reserve`` that records, among the reads, what it was asked for."""

    def reserve(nbytes: int, samples: int | None) -> Any:
        store.reads.append(f"reserve {nbytes} for {samples}")
        yield from ()

    flow = read_samples(_runtime(), source, 3, reserve)
    return run_blocking(flow, store.perform)


def test_a_shards_bytes_are_planned_from_its_head_before_it_is_read(
    pool: ThreadPoolExecutor,
) -> None:
    shard = write_shard(
        (f"s{i}", b, "jpg", lab) for i, (b, lab) in enumerate(zip(IMAGES, LABELS, strict=True))
    )
    store = Store({(INDEX, "s.tar"): shard}, pool)
    assert _read_planned(store, ShardSource(INDEX, "s.tar")) == (IMAGES, LABELS)
    # Before: the shard was read whole, and only then was any memory planned.
    bound = len(shard) // 1024 + 1  # the most samples a tar of this size can hold
    assert store.reads == ["HEAD s.tar", f"reserve {len(shard)} for {bound}", "s.tar"]


def test_a_webdataset_shard_is_planned_with_what_its_gzip_trailer_says_it_decompresses_to(
    pool: ThreadPoolExecutor,
) -> None:
    tar = webdataset_tar(IMAGES, LABELS, label_field="y")
    packed = gzip.compress(tar)
    # Two gzip members: the trailer states only the last one's size.
    two = gzip.compress(tar[:1024]) + gzip.compress(tar[1024:])
    objects = {(DATA, "a.tar.gz"): packed, (DATA, "b.tar"): tar, (DATA, "c.tar.gz"): two}
    store = Store(objects, pool)
    source = ShardSource(DATA, "a.tar.gz", DatasetLayout.WEBDATASET, label_field="y")
    assert _read_planned(store, source) == (IMAGES, LABELS)
    # Issue 27: the stored bytes and the tar beside them, planned before either is read.
    planned = len(packed) + len(tar)
    bound = planned // 1024 + 1
    assert store.reads == [
        "HEAD a.tar.gz",
        "tail a.tar.gz",
        f"reserve {planned} for {bound}",
        "a.tar.gz",
    ]
    # A plain tar ends in zero blocks: nothing more is planned.
    store.reads.clear()
    assert _read_planned(store, dataclasses.replace(source, shard="b.tar")) == (IMAGES, LABELS)
    assert store.reads[2] == f"reserve {len(tar)} for {len(tar) // 1024 + 1}"
    # A stream that grows beyond what its trailer states (and what was planned) is refused.
    with pytest.raises(InvalidShardError, match="trailer states"):
        _read_planned(store, dataclasses.replace(source, shard="c.tar.gz"))
    # An object too short for a trailer is not asked for one (Swift answers that range 416).
    store.objects[(DATA, "d.tar")] = b"\0\0"
    store.reads.clear()
    with pytest.raises(InvalidShardError, match="not a tar archive"):
        _read_planned(store, dataclasses.replace(source, shard="d.tar"))
    assert store.reads == ["HEAD d.tar", "reserve 2 for 1", "d.tar"]


def test_a_folder_parts_images_are_planned_from_the_sizes_it_pins(
    pool: ThreadPoolExecutor,
) -> None:
    store = _folder_store(pool)
    assert _read_planned(store, FOLDER) == (IMAGES, LABELS)
    planned = len(_part()) + sum(map(len, IMAGES))
    # The part (a list of names) is read first; every image only once their bytes are planned.
    assert store.reads[:2] == [PART, f"reserve {planned} for {len(NAMES)}"]
    assert sorted(store.reads[2:]) == sorted(NAMES)
