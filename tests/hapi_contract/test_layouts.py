"""The in-place layouts of ``hapi_contract.layouts`` and the manifest fields they add."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import tracemalloc

import pytest
import webdataset as wds
from PIL import Image

from hapi_contract.dataset import (
    DatasetLayout,
    DatasetManifest,
    InvalidManifestError,
    ShardFormatError,
    ShardInfo,
    md5_hex,
    object_name_problem,
    parse_manifest,
)
from hapi_contract.layouts import (
    ChangedObjectError,
    PartEntry,
    PartFormatError,
    check_folder_object,
    gzip_trailer_size,
    image_kind_of,
    image_kind_of_name,
    parse_part,
    part_name,
    read_webdataset_shard,
    write_part,
)


def _image(fmt: str, value: int = 0) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), (value, 255 - value, 7)).save(buffer, format=fmt)
    return buffer.getvalue()


JPG = _image("JPEG", 100)
PNG = _image("PNG")
WEBP = _image("WEBP")


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _wds_shard(samples: list[dict[str, object]]) -> bytes:
    buffer = io.BytesIO()
    with wds.TarWriter(buffer) as writer:
        for sample in samples:
            writer.write(sample)
    return buffer.getvalue()


def _entry(name: str = "train/cat/a.jpg", label: int = 0, size: int = 10) -> PartEntry:
    return PartEntry(name=name, etag="0" * 32, bytes=size, label=label)


# --- object names and image kinds -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("train/cat/a.jpg", None),
        ("a b/ü.JPEG", None),
        ("", "empty"),
        ("train/../x.jpg", "segment"),
        ("./x.jpg", "segment"),
        ("a/./b.jpg", "segment"),
        ("a\nb.jpg", "control"),
        ("a\x7fb.jpg", "control"),
        ("x" * 1025, "longer"),
    ],
)
def test_object_name_problem(name: str, problem: str | None) -> None:
    found = object_name_problem(name)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_image_kinds_from_bytes_and_names() -> None:
    assert [image_kind_of(d) for d in (JPG, PNG, WEBP, b"GIF89a")] == ["jpg", "png", "webp", None]
    assert image_kind_of_name("x/a.JPEG") == "jpg"
    assert image_kind_of_name("x/a.webp") == "webp"
    assert image_kind_of_name("x/a.gif") is None
    assert image_kind_of_name("x.d/noext") is None


# --- folder parts -----------------------------------------------------------------------------


def test_part_round_trip_is_deterministic() -> None:
    entries = [_entry("train/cat/a.jpg", 0), _entry("train/dog/ü b.PNG", 1, 99)]
    data = write_part(entries)
    assert data == write_part(list(entries))
    assert data.count(b"\n") == 2 and data.endswith(b"\n")
    assert json.loads(data.splitlines()[0]) == {
        "bytes": 10,
        "etag": "0" * 32,
        "label": 0,
        "name": "train/cat/a.jpg",
    }
    assert parse_part(data, "p", max_entries=2, num_classes=2) == entries
    assert part_name(3) == "hapi-index/part-000003.jsonl"


def _line(**fields: object) -> bytes:
    base: dict[str, object] = {"name": "a/b.jpg", "etag": "0" * 32, "bytes": 5, "label": 0}
    base.update(fields)
    return json.dumps(base).encode() + b"\n"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "no images"),
        (b"{not json}\n", "line 1: not a UTF-8 JSON"),
        (b"[1]\n", "line 1: not a JSON object"),
        (_line() + _line(), "line 2: 'a/b.jpg' is listed twice"),
        (_line(name="a/../b.jpg"), "segment"),
        (_line(name="a/\x01b.jpg"), "control character"),
        (_line(name="a/b.txt"), "not an image name"),
        (_line(bytes=0), "bytes"),
        (_line(bytes=10**9), "above the limit"),
        (_line(label=5), "out of range for 2 classes"),
        (_line(label=-1), "label"),
        (_line(label="1"), "label"),
        (_line(etag="X" * 32), "etag"),
        (_line(extra=1), "extra"),
        (_line() + _line(name="a/c.jpg") + _line(name="a/d.jpg"), "exceed the limit of 2"),
        (_line()[:-1], "truncated"),
        (b"\xff\n", "not a UTF-8 JSON"),
    ],
)
def test_parse_part_rejects(data: bytes, match: str) -> None:
    with pytest.raises(PartFormatError, match="^part-7") as caught:
        parse_part(data, "part-7", max_entries=2, num_classes=2)
    assert match in str(caught.value)


def test_check_folder_object_names_changed_objects() -> None:
    entry = PartEntry(name="train/cat/a.jpg", etag=md5_hex(JPG), bytes=len(JPG), label=3)
    sample = check_folder_object(entry, JPG, "data/train/cat/a.jpg")
    assert (sample.key, sample.ext, sample.label, sample.image_bytes) == (
        "train/cat/a.jpg",
        "jpg",
        3,
        JPG,
    )
    with pytest.raises(ChangedObjectError, match="data/train/cat/a.jpg changed after"):
        check_folder_object(entry, JPG[:-1] + b"x", "data/train/cat/a.jpg")
    lying = PartEntry(name="train/cat/a.jpg", etag=md5_hex(PNG), bytes=len(PNG), label=0)
    with pytest.raises(ShardFormatError, match="looks like png"):
        check_folder_object(lying, PNG, "data/train/cat/a.jpg")


def test_check_folder_object_hands_the_read_buffer_on_without_a_copy() -> None:
    # The in-proxy reads are bytearrays: a copy held a folder part's images twice (issue 27).
    read = bytearray(PNG)
    entry = PartEntry(name="train/cat/a.png", etag=md5_hex(PNG), bytes=len(PNG), label=1)
    sample = check_folder_object(entry, read, "data/train/cat/a.png")
    assert sample.image_bytes is read and sample.ext == "png"
    # A view, whose buffer the caller may reuse, is still copied.
    viewed = check_folder_object(entry, memoryview(PNG), "data/train/cat/a.png")
    assert type(viewed.image_bytes) is bytes and viewed.image_bytes == PNG


# --- manifests of the in-place layouts --------------------------------------------------------


def _info(name: str, samples: int, first: int, size: int = 100) -> ShardInfo:
    return ShardInfo(
        name=name, samples=samples, bytes=size, etag="a" * 32, first_index=first, image_bytes=50
    )


def test_shards_manifest_json_is_unchanged_and_old_json_parses() -> None:
    manifest = DatasetManifest.build(
        name="d", classes=["a"], shards=[_info("shards/shard-000000.tar", 2, 0)], shard_size=2
    )
    document = json.loads(manifest.to_json())
    assert not {"layout", "data_container", "label_field"} & document.keys()
    reparsed = parse_manifest(manifest.to_json())
    assert reparsed == manifest and reparsed.layout is DatasetLayout.SHARDS
    assert reparsed.data_location == "d"


def test_webdataset_manifest_allows_shards_of_any_size() -> None:
    shards = [_info("wds/a.tar", 5, 0), _info("wds/b.tar.gz", 9, 5), _info("wds/c.tgz", 2, 14)]
    manifest = DatasetManifest.build(
        name="idx",
        classes=["0", "1"],
        shards=shards,
        shard_size=9,
        layout=DatasetLayout.WEBDATASET,
        data_container="data",
        label_field="label",
    )
    again = parse_manifest(manifest.to_json())
    assert again == manifest and again.data_location == "data"
    assert [manifest.shard_of(i).name for i in (0, 4, 5, 13, 14, 15)] == [
        "wds/a.tar",
        "wds/a.tar",
        "wds/b.tar.gz",
        "wds/b.tar.gz",
        "wds/c.tgz",
        "wds/c.tgz",
    ]
    assert manifest.mean_shard_bytes_per_sample == pytest.approx(300 / 16)
    with pytest.raises(InvalidManifestError, match="at most shard_size=8"):
        DatasetManifest.build(
            name="idx", classes=["0"], shards=shards, shard_size=8, layout=DatasetLayout.WEBDATASET
        )


def test_folder_manifest_means_are_the_images() -> None:
    parts = [_info(part_name(0), 4, 0, size=700), _info(part_name(1), 1, 4, size=90)]
    manifest = DatasetManifest.build(
        name="idx", classes=["a", "b"], shards=parts, shard_size=4, layout=DatasetLayout.FOLDER
    )
    # The parts are the index; the baseline streams the images (50 bytes per part here).
    assert manifest.mean_shard_bytes_per_sample == manifest.mean_image_bytes_per_sample == 20
    assert manifest.total_bytes == 100
    assert parse_manifest(manifest.to_json()) == manifest


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layout": DatasetLayout.SHARDS, "data_container": "x"}, "in-place layouts only"),
        ({"layout": DatasetLayout.FOLDER, "label_field": "y"}, "webdataset layout only"),
        ({"layout": DatasetLayout.FOLDER, "data_container": "a/b"}, "without '/'"),
    ],
)
def test_manifest_rejects_misplaced_fields(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidManifestError, match=match):
        DatasetManifest.build(
            name="idx",
            classes=["a"],
            shards=[_info("shards/shard-000000.tar", 1, 0)],
            shard_size=1,
            **kwargs,  # type: ignore[arg-type]
        )


def test_manifest_rejects_a_shard_listed_twice() -> None:
    with pytest.raises(InvalidManifestError, match="listed twice"):
        DatasetManifest.build(
            name="idx",
            classes=["a"],
            shards=[_info("w/a.tar", 1, 0), _info("w/a.tar", 1, 1)],
            shard_size=1,
            layout=DatasetLayout.WEBDATASET,
        )


# --- the tolerant WebDataset reader -----------------------------------------------------------


def test_reads_a_shard_written_by_webdataset() -> None:
    data = _wds_shard(
        [
            {"__key__": f"dir.v2/s{i}", "jpeg": JPG, "cls": i, "seg.png": PNG, "json": {"y": 9}}
            for i in range(3)
        ]
    )
    samples = read_webdataset_shard(data, "w/a.tar", num_classes=3)
    assert [(s.key, s.ext, s.label) for s in samples] == [
        ("dir.v2/s0", "jpg", 0),
        ("dir.v2/s1", "jpg", 1),
        ("dir.v2/s2", "jpg", 2),
    ]
    assert all(s.image_bytes == JPG for s in samples)
    assert [s.label for s in read_webdataset_shard(data, "w", label_field="y")] == [9, 9, 9]


def test_a_webdataset_shard_read_buffer_is_held_once() -> None:
    # Issue 27: the read buffer was copied whole, then every member; the images are read-only
    # views of it now, and a gzip shard's decompression is handed on without a copy.
    image = JPG[:3] + bytes(range(256)) * 8192
    members = [
        (f"s{i}.{ext}", image if ext == "jpg" else b"2") for i in range(8) for ext in ("jpg", "cls")
    ]
    data = bytearray(_tar(members))
    tracemalloc.start()
    try:
        samples = read_webdataset_shard(data, "w/big.tar")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) // 16, f"{peak} bytes allocated to read a {len(data)}-byte shard"
    assert [s.label for s in samples] == [2] * 8
    for sample in samples:
        assert isinstance(sample.image_bytes, memoryview) and sample.image_bytes.obj is data
        assert sample.image_bytes.readonly and sample.image_bytes == image
    unzipped = read_webdataset_shard(gzip.compress(bytes(data)), "w/big.tar.gz")
    assert [s.image_bytes for s in unzipped] == [image] * 8


def test_any_member_order_txt_labels_webp_and_gzip() -> None:
    data = _tar(
        [
            ("b.txt", b" 4\n"),
            ("a.WEBP", WEBP),
            ("dir/", b""),
            ("b.png", PNG),
            ("a.cls", b"1"),
            ("a.txt", b"7"),
            ("README", b"no extension: skipped"),
        ]
    )
    expected = [("b", "png", 4), ("a", "webp", 1)]
    for blob in (data, gzip.compress(data)):
        samples = read_webdataset_shard(blob, "w/x.tgz")
        assert [(s.key, s.ext, s.label) for s in samples] == expected


def test_a_gzip_shard_decompresses_to_no_more_than_its_trailer_states() -> None:
    data = _tar([("a.jpg", JPG), ("a.cls", b"1"), ("b.jpg", JPG), ("b.cls", b"2")])
    assert gzip_trailer_size(gzip.compress(data)) == len(data)
    assert gzip_trailer_size(data) == 0 and gzip_trailer_size(b"\x01") == 0  # a plain tar
    # What a server plans for a .tar.gz (issue 27): a stream of two members states only the
    # last one's size, so it is refused rather than decompressed beyond the plan.
    two = gzip.compress(data[:1024]) + gzip.compress(data[1024:])
    with pytest.raises(ShardFormatError, match=r"w/two.tar.gz: .* trailer states .* one gzip"):
        read_webdataset_shard(two, "w/two.tar.gz")
    assert [s.label for s in read_webdataset_shard(gzip.compress(data), "w/one.tar.gz")] == [1, 2]


def test_gzip_bomb_is_refused_before_it_expands() -> None:
    bomb = gzip.compress(b"\0" * (4 * 1024 * 1024))
    with pytest.raises(ShardFormatError, match="w/bomb.tar.gz: gzip stream expands beyond"):
        read_webdataset_shard(bomb, "w/bomb.tar.gz", max_tar_bytes=1024 * 1024)


@pytest.mark.parametrize(
    ("members", "kwargs", "match"),
    [
        ([("a.jpg", JPG)], {}, "sample 'a' has no .cls or .txt label"),
        ([("a.cls", b"1")], {}, "sample 'a' has no image member"),
        ([("a.jpg", JPG), ("a.png", PNG), ("a.cls", b"1")], {}, "sample 'a' has two images"),
        ([("a.jpg", JPG), ("a.cls", b"1"), ("a.cls", b"2")], {}, "two .cls members"),
        ([("a.jpg", PNG), ("a.cls", b"1")], {}, "looks like png"),
        ([("a.jpg", b"GIF89a..."), ("a.cls", b"1")], {}, "not a JPEG, PNG or WebP"),
        ([("a.jpg", JPG), ("a.cls", b"x")], {}, "bad label"),
        ([("a.jpg", JPG), ("a.cls", b"5")], {"num_classes": 5}, "out of range for 5"),
        ([("a.jpg", JPG), ("a.json", b"{}")], {"label_field": "y"}, "no field 'y'"),
        ([("a.jpg", JPG), ("a.json", b'{"y": "3"}')], {"label_field": "y"}, "not a non-negative"),
        ([("a.jpg", JPG), ("a.cls", b"1")], {"label_field": "y"}, "no .json member"),
        ([("a.jpg", JPG), ("a.cls", b"1")], {"max_image_bytes": 10}, "exceeds the limit of 10"),
        (
            [("a.jpg", JPG), ("a.cls", b"1"), ("b.jpg", JPG), ("b.cls", b"1")],
            {"max_samples": 1},
            "more than 1 samples",
        ),
        ([("a\x01.jpg", JPG)], {}, "control character"),
        ([("a.cls", b"1" * 40)], {}, "exceeds the limit of 32"),
    ],
)
def test_reader_rejects(
    members: list[tuple[str, bytes]], kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ShardFormatError, match="^w/x.tar: ") as caught:
        read_webdataset_shard(_tar(members), "w/x.tar", **kwargs)  # type: ignore[arg-type]
    assert match in str(caught.value)


@pytest.mark.parametrize(
    ("mangle", "match"),
    [
        (lambda data: data[: len(data) // 2], "truncated"),
        (lambda data: b"not a tar at all" * 64, "tar archive"),
        (lambda data: gzip.compress(data)[:-20], "gzip"),
        (lambda data: b"", "tar archive"),
    ],
)
def test_reader_rejects_damaged_archives(mangle, match: str) -> None:  # type: ignore[no-untyped-def]
    data = _tar([("a.jpg", JPG), ("a.cls", b"1"), ("b.jpg", JPG), ("b.cls", b"2")])
    with pytest.raises(ShardFormatError, match=match):
        read_webdataset_shard(mangle(data), "w/x.tar")


def test_keys_with_dots_are_explained() -> None:
    # Issue 28, case 8: a.b.c61.jpeg is key 'a', extension 'b.c61.jpeg' for WebDataset.
    members = [
        (f"a.b.c{i}.{ext}", JPG if ext == "jpeg" else b"1")
        for i in range(10)
        for ext in ("jpeg", "cls")
    ]
    with pytest.raises(ShardFormatError, match="^w/x.tar: shard contains no samples") as caught:
        read_webdataset_shard(_tar(members), "w/x.tar")
    message = str(caught.value)
    assert "first dot" in message
    assert "'a.b.c0.jpeg'" in message
    assert "'b.c0.jpeg'" in message
    assert "20 members" in message
