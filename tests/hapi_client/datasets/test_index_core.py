"""The in-place indexer's core (``run_index``) over an in-memory store (a unit test: a fake)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import webdataset as wds
from PIL import Image

from hapi_client.datasets import (
    DatasetIndexError,
    IndexInterruptedError,
    IndexRequest,
    IndexState,
    ListingEntry,
    run_index,
)
from hapi_client.datasets.errors import DatasetError
from hapi_contract.dataset import (
    MANIFEST_NAME,
    DatasetLayout,
    DatasetManifest,
    md5_hex,
    parse_manifest,
)
from hapi_contract.layouts import parse_part


class MemoryStore:
    """Containers of objects in memory, listed as Swift lists them (sorted, marker, limit)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, bytes]] = {}
        self.large: set[tuple[str, str]] = set()
        self.markers: list[str] = []
        self.writes: list[str] = []
        self.deletes: list[str] = []

    def add(self, container: str, name: str, data: bytes) -> None:
        self.objects.setdefault(container, {})[name] = data

    def list_page(self, container: str, prefix: str, marker: str, limit: int) -> list[ListingEntry]:
        self.markers.append(marker)
        names = sorted(n for n in self.objects[container] if n.startswith(prefix) and n > marker)
        return [
            ListingEntry(
                name=n,
                etag=md5_hex(self.objects[container][n]),
                bytes=len(self.objects[container][n]),
                large=(container, n) in self.large,
            )
            for n in names[:limit]
        ]

    def read(self, container: str, name: str) -> bytes:
        return self.objects[container][name]

    def read_chunks(self, container: str, name: str) -> Iterator[bytes]:
        data = self.objects[container][name]
        yield from (data[i : i + 7] for i in range(0, len(data), 7))

    def exists(self, container: str, name: str) -> bool:
        return name in self.objects.get(container, {})

    def put_if_changed(
        self,
        container: str,
        name: str,
        data: bytes,
        content_type: str,
        before_upload: Callable[[], None] | None = None,
    ) -> bool:
        if self.objects.get(container, {}).get(name) == data:
            return False
        if before_upload is not None:
            before_upload()
        self.writes.append(name)
        self.add(container, name, data)
        return True

    def delete(self, container: str, name: str) -> None:
        self.deletes.append(name)
        self.objects.get(container, {}).pop(name, None)

    def ensure_container(self, container: str) -> None:
        self.objects.setdefault(container, {})


def _jpeg(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), (value % 256, 3, 5)).save(buffer, format="JPEG")
    return buffer.getvalue()


CLASSES = ["a", "a-b", "dog", "Zebra"]


def _folder_store(per_class: int = 5) -> MemoryStore:
    store = MemoryStore()
    for c, name in enumerate(CLASSES):
        for i in range(per_class):
            store.add("data", f"train/{name}/sub/{i}.jpg", _jpeg(c * 50 + i))
    store.add("data", "val/x/0.jpg", _jpeg(1))
    return store


def _run(
    store: MemoryStore, tmp_path: Path, request: IndexRequest, **kwargs: object
) -> DatasetManifest:
    state = IndexState(tmp_path / "state", request.fingerprint("memory"))
    return run_index(store, request, state, **kwargs).manifest  # type: ignore[arg-type]


def _part_entries(store: MemoryStore, manifest: DatasetManifest) -> list[list[tuple[str, int]]]:
    return [
        [
            (e.name, e.label)
            for e in parse_part(store.read(manifest.name, s.name), s.name, max_entries=10**6)
        ]
        for s in manifest.shards
    ]


def test_folder_layout_classes_parts_and_pins(tmp_path: Path) -> None:
    store = _folder_store()
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train", shard_size=6)
    manifest = _run(store, tmp_path, request)
    # ImageFolder's order: sorted by code point ("Zebra" first, "a" before "a-b").
    assert manifest.classes == ["Zebra", "a", "a-b", "dog"]
    assert (manifest.name, manifest.data_container, manifest.layout) == (
        "data",
        None,
        DatasetLayout.FOLDER,
    )
    assert manifest.num_samples == 20 and [s.samples for s in manifest.shards] == [6, 6, 6, 2]
    parts = _part_entries(store, manifest)
    names = [name for part in parts for name, _ in part]
    assert sorted(names) == sorted(n for n in store.objects["data"] if n.startswith("train/"))
    for name, label in (pair for part in parts for pair in part):
        assert name.split("/")[1] == manifest.classes[label]
    # Dealt, not cut from the sorted listing: no part of 6 is a run of one class.
    assert all(len({label for _, label in part}) > 1 for part in parts[:3])
    entries = [e for s in manifest.shards for e in parse_part(store.read("data", s.name), s.name)]
    assert all(e.etag == md5_hex(store.read("data", e.name)) for e in entries)
    assert manifest.mean_image_bytes_per_sample == pytest.approx(sum(e.bytes for e in entries) / 20)
    assert parse_manifest(store.read("data", MANIFEST_NAME)) == manifest


def test_the_deal_does_not_depend_on_the_page_size(tmp_path: Path) -> None:
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train/", into="idx", shard_size=7)
    first, second = _folder_store(), _folder_store()
    a = _run(first, tmp_path / "a", request, page_size=3)
    b = _run(second, tmp_path / "b", request)
    assert a == b and a.data_container == "data" and a.name == "idx"
    assert first.objects["idx"] == second.objects["idx"]
    assert set(first.objects["idx"]) == {MANIFEST_NAME, *(s.name for s in a.shards)}


def test_a_second_run_writes_nothing_and_skips_its_own_objects(tmp_path: Path) -> None:
    store = _folder_store()
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="", shard_size=6)
    store.objects["data"].pop("val/x/0.jpg")
    store.objects["data"] = {k.removeprefix("train/"): v for k, v in store.objects["data"].items()}
    manifest = _run(store, tmp_path, request)
    store.writes.clear()
    # The parts and the manifest now lie in the listed container, under the empty prefix.
    assert _run(store, tmp_path, request) == manifest
    assert store.writes == [] and store.deletes == []


def test_resume_after_an_interrupted_listing(tmp_path: Path) -> None:
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train/", shard_size=6)
    reference = _run(_folder_store(), tmp_path / "reference", request, page_size=4)
    store = _folder_store()
    with pytest.raises(IndexInterruptedError, match="after listing 2 pages"):
        _run(store, tmp_path, request, page_size=4, stop=lambda phase, n: n == 2)
    assert store.writes == []
    store.markers.clear()
    assert _run(store, tmp_path, request, page_size=4) == reference
    # Continued from the marker of the second page, not from the start.
    assert store.markers[0] == "train/a-b/sub/2.jpg"


def test_resume_after_interrupted_parts_rewrites_none(tmp_path: Path) -> None:
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train/", shard_size=3)
    store = _folder_store()
    with pytest.raises(IndexInterruptedError, match="after 4 parts"):
        _run(store, tmp_path, request, stop=lambda phase, n: phase == "parts" and n == 4)
    written = list(store.writes)
    assert len(written) == 4 and MANIFEST_NAME not in store.objects["data"]
    store.writes.clear()
    manifest = _run(store, tmp_path, request)
    assert len(manifest.shards) == 7
    assert not set(store.writes) & set(written)
    assert not (tmp_path / "state").exists()  # cleared once the manifest is written


def test_a_shorter_index_deletes_its_stale_parts_and_first_its_manifest(tmp_path: Path) -> None:
    store = _folder_store()
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train/", shard_size=3)
    first = _run(store, tmp_path, request)
    for i in range(5):
        store.objects["data"].pop(f"train/dog/sub/{i}.jpg")
    second = _run(store, tmp_path, request)
    assert len(second.shards) == 5 < len(first.shards)
    assert MANIFEST_NAME in store.deletes[:1]
    assert set(store.deletes[1:]) == {
        "hapi-index/part-000005.jsonl",
        "hapi-index/part-000006.jsonl",
    }
    assert "dog" not in second.classes


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_labels_object(tmp_path: Path, fmt: str) -> None:
    store = _folder_store()
    names = sorted(n for n in store.objects["data"] if "/sub/" in n)[:8]
    rows = [(name, "odd" if i % 2 else "even") for i, name in enumerate(names)]
    if fmt == "csv":
        text = "name,class\n" + "".join(f'"{n}",{c}\n' for n, c in rows)
    else:
        text = "".join(json.dumps({"name": n, "class": c}) + "\n" for n, c in rows)
    store.add("data", f"labels.{fmt}", text.encode())
    request = IndexRequest("data", DatasetLayout.FOLDER, labels=f"labels.{fmt}", shard_size=4)
    manifest = _run(store, tmp_path, request)
    assert manifest.classes == ["even", "odd"] and manifest.num_samples == 8
    labelled = dict(pair for part in _part_entries(store, manifest) for pair in part)
    assert labelled == {n: manifest.classes.index(c) for n, c in rows}


def _bad_label_store(lines: str) -> MemoryStore:
    store = _folder_store(1)
    store.add("data", "labels.csv", lines.encode())
    return store


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ("train/a/sub/0.jpg,x\ntrain/nope.jpg,y\n", "names 1 objects that are not under"),
        (
            "train/a/sub/0.jpg,x\ntrain/a/sub/0.jpg,y\n",
            "line 2: 'train/a/sub/0.jpg' is listed twice",
        ),
        ("train/../a.jpg,x\n", "segment"),
        ("train/a/sub/0.jpg,\n", "class name must be"),
        ("train/a/sub/0.jpg\n", "expected 2 columns"),
        ("", "names no object"),
        ('{"name": "train/a/sub/0.jpg"}\n', 'expected {"name"'),
    ],
)
def test_bad_labels_objects(tmp_path: Path, lines: str, match: str) -> None:
    request = IndexRequest("data", DatasetLayout.FOLDER, labels="labels.csv")
    with pytest.raises(DatasetIndexError, match=match):
        _run(_bad_label_store(lines), tmp_path, request)


def _store_with(name: str, data: bytes, large: bool = False) -> MemoryStore:
    store = _folder_store(1)
    store.add("data", name, data)
    if large:
        store.large.add(("data", name))
    return store


@pytest.mark.parametrize(
    ("name", "data", "large", "match"),
    [
        ("train/a/empty.jpg", b"", False, "zero bytes"),
        ("train/a/big.jpg", b"x" * 2000, False, "above the limit of 1000 bytes"),
        ("train/a/../b.jpg", b"x", False, "segment"),
        ("train/a/\x1bb.jpg", b"x", False, "control character"),
        ("train/a/slo.jpg", b"x", True, "static large object"),
        ("train/loose.jpg", b"x", False, "not in a class folder"),
        ("train/empty/", b"", False, "class folder train/empty/ holds no images"),
    ],
)
def test_bad_objects_are_named(
    tmp_path: Path, name: str, data: bytes, large: bool, match: str
) -> None:
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train/", max_image_bytes=1000)
    with pytest.raises(DatasetIndexError, match=match) as caught:
        _run(_store_with(name, data, large), tmp_path, request)
    assert caught.value.object_name == name


STRAYS = {
    "train/README.txt": b"read me",
    "train/.DS_Store": b"\0\0\0\1Bud1",
    "train/a/Thumbs.db": b"thumbs",
    "train/a/._0.jpg": b"AppleDouble",  # a hidden name is not an image, whatever its extension
    "train/.thumbnails/0.jpg": _jpeg(9),  # nor is a hidden folder a class
    "train/.thumbnails/": b"",
    "train/dog/.keep": b"",  # empty, but not an image: skipped, not refused as empty
}


def _stray_store() -> MemoryStore:
    store = _folder_store(3)
    for name, data in STRAYS.items():
        store.add("data", name, data)
    return store


def test_stray_objects_are_skipped_counted_and_named(tmp_path: Path) -> None:
    # Issue 28, case 7: ImageFolder users expect README.txt, .DS_Store, Thumbs.db to be skipped.
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train/", shard_size=5)
    state = IndexState(tmp_path / "state", request.fingerprint("memory"))
    result = run_index(_stray_store(), request, state, page_size=4)
    manifest = result.manifest
    assert manifest.classes == ["Zebra", "a", "a-b", "dog"] and manifest.num_samples == 12
    strays = sorted(name for name in STRAYS if not name.endswith("/"))
    assert result.objects_skipped == len(strays) and sorted(result.skipped_examples) == strays
    assert manifest.skipped_objects == len(strays)
    assert sorted(manifest.skipped_examples) == strays
    assert parse_manifest(manifest.to_json()) == manifest


def test_skipped_objects_survive_an_interrupted_listing(tmp_path: Path) -> None:
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train/", shard_size=5)
    store = _stray_store()
    with pytest.raises(IndexInterruptedError):
        _run(store, tmp_path, request, page_size=4, stop=lambda phase, n: n == 3)
    manifest = _run(store, tmp_path, request, page_size=4)
    assert manifest.skipped_objects == len([n for n in STRAYS if not n.endswith("/")])


def test_strict_refuses_the_stray_objects_of_a_page_at_once(tmp_path: Path) -> None:
    store = _stray_store()
    request = IndexRequest("data", DatasetLayout.FOLDER, prefix="train/", strict=True)
    with pytest.raises(
        DatasetIndexError, match="objects under 'data/train/' are hidden or not"
    ) as caught:
        _run(store, tmp_path, request)
    message = str(caught.value)
    assert all(repr(name) in message for name in STRAYS if not name.endswith("/"))
    assert caught.value.object_name == "train/.DS_Store"
    assert store.writes == []


def test_a_labels_object_naming_a_non_image_is_refused(tmp_path: Path) -> None:
    store = _folder_store(1)
    store.add("data", "train/a/notes.txt", b"hello")
    store.add("data", "labels.csv", b"train/a/notes.txt,x\n")
    request = IndexRequest("data", DatasetLayout.FOLDER, labels="labels.csv")
    with pytest.raises(DatasetIndexError, match="notes.txt: named by labels.csv, but not an image"):
        _run(store, tmp_path, request)


def test_empty_prefix_and_an_uploaded_dataset_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetIndexError, match="nothing to index under 'data/nothing/'"):
        _run(
            _folder_store(), tmp_path, IndexRequest("data", DatasetLayout.FOLDER, prefix="nothing")
        )
    store = _folder_store()
    uploaded = DatasetManifest.model_validate(
        {
            "name": "data",
            "num_samples": 1,
            "shard_size": 1,
            "classes": ["a"],
            "shards": [
                {
                    "name": "shards/shard-000000.tar",
                    "samples": 1,
                    "bytes": 10,
                    "etag": "0" * 32,
                    "first_index": 0,
                    "image_bytes": 5,
                }
            ],
            "mean_image_bytes_per_sample": 5,
            "mean_shard_bytes_per_sample": 10,
        }
    )
    store.add("data", MANIFEST_NAME, uploaded.to_json())
    with pytest.raises(DatasetIndexError, match="holds an uploaded dataset"):
        _run(store, tmp_path / "2", IndexRequest("data", DatasetLayout.FOLDER, prefix="train"))
    assert store.writes == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layout": "shards"}, "uploaded"),
        ({"layout": "tree"}, "unknown layout"),
        ({"layout": "webdataset", "labels": "x.csv"}, "folder layout"),
        ({"layout": "folder", "label_field": "y"}, "webdataset layout"),
        ({"layout": "folder", "shard_size": 0}, "shard size"),
        ({"layout": "folder", "into": "a/b"}, "invalid container"),
    ],
)
def test_bad_requests(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(DatasetError, match=match):
        IndexRequest("data", **kwargs)  # type: ignore[arg-type]


def _wds(samples: list[dict[str, object]], gz: bool = False) -> bytes:
    buffer = io.BytesIO()
    with wds.TarWriter(buffer, compress=gz) as writer:
        for sample in samples:
            writer.write(sample)
    return buffer.getvalue()


def test_webdataset_layout(tmp_path: Path) -> None:
    store = MemoryStore()
    store.add(
        "data",
        "wds/a-000.tar",
        _wds([{"__key__": f"a{i}", "jpg": _jpeg(i), "cls": i % 3} for i in range(5)]),
    )
    store.add(
        "data",
        "wds/a-001.tar.gz",
        _wds([{"__key__": f"b{i}", "jpeg": _jpeg(i), "cls": 4} for i in range(2)], gz=True),
    )
    store.add("data", "wds/info.json", b"{}")
    request = IndexRequest("data", DatasetLayout.WEBDATASET, prefix="wds", into="idx")
    state = IndexState(tmp_path / "s", request.fingerprint("memory"))
    result = run_index(store, request, state)
    manifest = result.manifest
    assert result.objects_skipped == 1 and result.skipped_examples == ("wds/info.json",)
    assert (manifest.skipped_objects, manifest.skipped_examples) == (1, ["wds/info.json"])
    assert [(s.name, s.samples, s.first_index) for s in manifest.shards] == [
        ("wds/a-000.tar", 5, 0),
        ("wds/a-001.tar.gz", 2, 5),
    ]
    assert manifest.shard_size == 5 and manifest.classes == ["0", "1", "2", "3", "4"]
    assert all(s.etag == md5_hex(store.read("data", s.name)) for s in manifest.shards)
    assert set(store.objects["idx"]) == {MANIFEST_NAME} and manifest.data_container == "data"


def test_webdataset_bad_shard_is_named(tmp_path: Path) -> None:
    store = MemoryStore()
    store.add("data", "w/0.tar", _wds([{"__key__": "k", "jpg": _jpeg(1)}]))
    request = IndexRequest("data", DatasetLayout.WEBDATASET, into="idx")
    with pytest.raises(DatasetIndexError, match="data/w/0.tar: sample 'k' has no .cls") as caught:
        _run(store, tmp_path, request)
    assert caught.value.object_name == "w/0.tar"
    with pytest.raises(DatasetIndexError, match="no WebDataset shards"):
        _run(
            _folder_store(),
            tmp_path / "2",
            IndexRequest("data", DatasetLayout.WEBDATASET),
        )
