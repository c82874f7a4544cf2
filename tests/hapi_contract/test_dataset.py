"""The shard tar format and the manifest schema of ``hapi_contract.dataset``."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc

import pytest
from PIL import Image

from hapi_contract.dataset import (
    MAX_MANIFEST_BYTES,
    DatasetManifest,
    InvalidManifestError,
    ShardFormatError,
    ShardInfo,
    ShardSample,
    image_extension_of,
    md5_hex,
    parse_manifest,
    read_shard,
    sample_key,
    shard_name,
    write_shard,
)
from hapi_contract.errors import ContractError


def _image(fmt: str, value: int = 0, size: tuple[int, int] = (4, 3)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (value, 255 - value, 7)).save(buffer, format=fmt)
    return buffer.getvalue()


PNG = _image("PNG")
JPG = _image("JPEG", 200)


def _samples(n: int = 3) -> list[tuple[str, bytes, str, int]]:
    return [
        (sample_key(i), _image("PNG", i), "png", i)
        if i % 2
        else (sample_key(i), _image("JPEG", i), "jpg", i)
        for i in range(n)
    ]


def _raw_tar(members: list[tuple[str, bytes]]) -> bytes:
    """A tar with exactly these regular-file members (no validation)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


# --- shards: round trip -------------------------------------------------------------------


def test_write_then_read_round_trips_every_field() -> None:
    samples = _samples(5)
    decoded = read_shard(write_shard(samples))
    assert decoded == [ShardSample(*sample) for sample in samples]
    assert all(isinstance(s.label, int) for s in decoded)
    assert Image.open(io.BytesIO(decoded[1].image_bytes)).size == (4, 3)


def test_write_shard_is_deterministic_and_follows_webdataset_layout() -> None:
    first = write_shard(_samples(3))
    assert first == write_shard(_samples(3))
    assert md5_hex(first) == md5_hex(write_shard(iter(_samples(3))))
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "000000000.cls", "000000000.jpg", "000000001.cls", "000000001.png",
        "000000002.cls", "000000002.jpg",
    ]  # fmt: skip
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {
        (0, 0, 0, "", "", 0o644)
    }
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        handle = tar.extractfile("000000002.cls")
        assert handle is not None and handle.read() == b"2"


def test_write_shard_stores_jpeg_extension_as_jpg() -> None:
    (sample,) = read_shard(write_shard([("a", JPG, "JPEG", 1)]))
    assert sample.ext == "jpg"


def test_shard_samples_are_plain_tuples_for_write_shard() -> None:
    samples = [ShardSample("k1", PNG, "png", 0), ShardSample("k2", JPG, "jpg", 9)]
    assert read_shard(write_shard(samples)) == samples


def test_read_shard_accepts_labels_with_whitespace_and_any_member_order() -> None:
    data = _raw_tar([("a.png", PNG), ("a.cls", b" 7\n"), ("b.cls", b"0"), ("b.jpg", JPG)])
    assert [(s.key, s.ext, s.label) for s in read_shard(data)] == [("a", "png", 7), ("b", "jpg", 0)]


def test_helpers() -> None:
    assert shard_name(0) == "shards/shard-000000.tar"
    assert shard_name(1234567) == "shards/shard-1234567.tar"
    assert sample_key(42) == "000000042"
    assert image_extension_of(PNG) == "png" and image_extension_of(JPG) == "jpg"
    assert image_extension_of(b"GIF89a") is None
    with pytest.raises(ValueError):
        shard_name(-1)


# --- shards: every invalid case -------------------------------------------------------------


def _expect_invalid(data: bytes, match: str, **limits: int) -> None:
    with pytest.raises(ShardFormatError, match=match):
        read_shard(data, **limits)


@pytest.mark.parametrize(
    "data", [b"", b"not a tar at all" * 64, bytes(range(256)) * 8], ids=["empty", "text", "binary"]
)
def test_not_a_tar(data: bytes) -> None:
    _expect_invalid(data, "not a tar archive")


def test_gzip_compressed_tar_is_rejected() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("a.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"1"))
    _expect_invalid(buffer.getvalue(), "not a tar archive")


def test_only_end_marker_means_no_samples() -> None:
    _expect_invalid(b"\0" * 10240, "no samples")


def test_missing_cls() -> None:
    _expect_invalid(
        _raw_tar([("a.png", PNG), ("b.cls", b"1"), ("b.png", PNG)]), "'a'.*missing .cls"
    )


def test_missing_image() -> None:
    _expect_invalid(_raw_tar([("a.cls", b"1")]), "missing image")


@pytest.mark.parametrize("label", [b"abc", b"-1", b"", b"1.5", b"0x1", b"1 2", b"1234567890"])
def test_bad_label(label: bytes) -> None:
    _expect_invalid(_raw_tar([("a.cls", label), ("a.png", PNG)]), "bad label")


def test_label_out_of_range_for_num_classes() -> None:
    data = write_shard([("a", PNG, "png", 10)])
    assert read_shard(data, num_classes=11)[0].label == 10
    _expect_invalid(data, "out of range for 10 classes", num_classes=10)


@pytest.mark.parametrize("name", ["a.txt", "a.jpeg", "a.gif", "a.tar.gz", "a.cls.png"])
def test_unknown_extension(name: str) -> None:
    _expect_invalid(_raw_tar([("a.cls", b"1"), (name, PNG)]), "unknown extension")


def test_member_without_extension() -> None:
    _expect_invalid(_raw_tar([("README", b"hi")]), "no extension")


def test_duplicated_key_later_in_the_shard() -> None:
    members = [("a.cls", b"1"), ("a.png", PNG), ("b.cls", b"2"), ("b.png", PNG)]
    _expect_invalid(_raw_tar([*members, ("a.cls", b"3"), ("a.png", PNG)]), "duplicated key 'a'")


def test_duplicated_member_within_a_sample() -> None:
    _expect_invalid(_raw_tar([("a.cls", b"1"), ("a.cls", b"2"), ("a.png", PNG)]), "duplicated key")


def test_two_images_for_one_key() -> None:
    _expect_invalid(_raw_tar([("a.cls", b"1"), ("a.png", PNG), ("a.jpg", JPG)]), "two images")


def test_too_many_samples() -> None:
    data = write_shard(_samples(4))
    assert len(read_shard(data, max_samples=4)) == 4
    _expect_invalid(data, "more than 3 samples", max_samples=3)


def test_member_too_large() -> None:
    big = _image("PNG", size=(64, 64))
    data = write_shard([("a", big, "png", 1)])
    assert read_shard(data, max_image_bytes=len(big))[0].image_bytes == big
    _expect_invalid(data, f"{len(big)} bytes exceeds the limit of {len(big) - 1}",
                    max_image_bytes=len(big) - 1)  # fmt: skip


def test_label_member_too_large() -> None:
    _expect_invalid(_raw_tar([("a.cls", b"1" * 33), ("a.png", PNG)]), "exceeds the limit of 32")


@pytest.mark.parametrize(
    "name", ["../evil.png", "/etc/evil.png", "dir/a.png", "a/../../b.png", "..\\x.png", ".a.png"]
)
def test_path_traversal_names(name: str) -> None:
    _expect_invalid(_raw_tar([("a.cls", b"1"), (name, PNG)]), "not allowed")


@pytest.mark.parametrize("key", ["a b", "é", "x" * 65, "-a"])
def test_malformed_keys(key: str) -> None:
    _expect_invalid(_raw_tar([(f"{key}.cls", b"1"), (f"{key}.png", PNG)]), "invalid sample key")


@pytest.mark.parametrize(
    "kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE]
)
def test_non_regular_members(kind: bytes) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("a.png")
        info.type = kind
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    _expect_invalid(buffer.getvalue(), "not a regular file")


def test_image_bytes_must_match_extension() -> None:
    _expect_invalid(_raw_tar([("a.cls", b"1"), ("a.jpg", PNG)]), "looks like png")
    _expect_invalid(_raw_tar([("a.cls", b"1"), ("a.png", b"GIF89a...")]), "neither JPEG nor PNG")


def test_truncation_anywhere_is_detected() -> None:
    data = write_shard(_samples(3))
    cuts = sorted({1, 100, 511, 512, 513, 1024, 1536, 2048, 3000, len(data) // 2})
    members_end = _members_end(data)
    cuts += [members_end, members_end + 512, members_end + 1023]
    for cut in cuts:
        with pytest.raises(ShardFormatError):
            read_shard(data[:cut])
    assert len(read_shard(data[: members_end + 1024])) == 3


def _members_end(data: bytes) -> int:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        last = tar.getmembers()[-1]
    return last.offset_data + -(-last.size // 512) * 512


def test_garbage_in_the_middle_is_detected() -> None:
    data = bytearray(write_shard(_samples(3)))
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        second_sample_header = tar.getmembers()[2].offset
    data[second_sample_header : second_sample_header + 8] = b"garbage!"
    with pytest.raises(ShardFormatError, match="end-of-archive"):
        read_shard(bytes(data))


def test_shard_errors_belong_to_the_contract_tree() -> None:
    with pytest.raises(ContractError):
        read_shard(b"")
    with pytest.raises(ValueError):
        read_shard(b"")


# --- write_shard refuses what read_shard would reject ----------------------------------------


@pytest.mark.parametrize(
    ("sample", "match"),
    [
        (("a/b", PNG, "png", 1), "invalid sample key"),
        (("a.b", PNG, "png", 1), "invalid sample key"),
        (("", PNG, "png", 1), "invalid sample key"),
        (("a", PNG, "gif", 1), "unknown image extension"),
        (("a", PNG, "jpg", 1), "do not match extension"),
        (("a", b"plain text", "png", 1), "neither JPEG nor PNG"),
        (("a", PNG, "png", -1), "label must be"),
        (("a", PNG, "png", 10**9), "label must be"),
        (("a", PNG, "png", True), "label must be"),
    ],
)
def test_write_shard_rejects_invalid_samples(
    sample: tuple[str, bytes, str, int], match: str
) -> None:
    with pytest.raises(ShardFormatError, match=match):
        write_shard([sample])


def test_write_shard_rejects_duplicated_keys() -> None:
    with pytest.raises(ShardFormatError, match="duplicated key"):
        write_shard([("a", PNG, "png", 1), ("b", PNG, "png", 1), ("a", PNG, "png", 2)])


# --- manifest ------------------------------------------------------------------------------


def _shard(index: int, samples: int, first: int, size: int = 5000) -> ShardInfo:
    return ShardInfo(
        name=shard_name(index),
        samples=samples,
        bytes=size,
        etag=md5_hex(str(index).encode()),
        first_index=first,
        image_bytes=samples * 10,
    )


def _manifest(**overrides: object) -> dict[str, object]:
    shards = [_shard(0, 100, 0), _shard(1, 100, 100), _shard(2, 30, 200, size=1500)]
    built = DatasetManifest.build(
        name="demo", classes=["cat", "dog"], shards=shards, shard_size=100, source="unit test"
    )
    data: dict[str, object] = json.loads(built.to_json())
    data.update(overrides)
    return data


def test_manifest_build_computes_totals_and_means() -> None:
    manifest = parse_manifest(json.dumps(_manifest()))
    assert manifest.format_version == 1
    assert manifest.num_samples == 230
    assert manifest.num_classes == 2
    assert manifest.total_bytes == 11500
    assert manifest.mean_shard_bytes_per_sample == pytest.approx(11500 / 230)
    assert manifest.mean_image_bytes_per_sample == pytest.approx(10.0)
    assert manifest.shard_of(0).name == shard_name(0)
    assert manifest.shard_of(229).name == shard_name(2)
    with pytest.raises(IndexError):
        manifest.shard_of(230)


def test_manifest_json_round_trip_is_byte_stable() -> None:
    manifest = parse_manifest(json.dumps(_manifest()))
    again = parse_manifest(manifest.to_json())
    assert again == manifest
    assert again.to_json() == manifest.to_json()


def _shards_with(**changes: object) -> list[dict[str, object]]:
    shards: list[dict[str, object]] = list(_manifest()["shards"])  # type: ignore[call-overload]
    index = int(changes.pop("index", 1))  # type: ignore[call-overload]
    shards[index] = {**shards[index], **changes}
    return shards


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"format_version": 2}, "format_version"),
        ({"extra": 1}, "extra"),
        ({"classes": []}, "classes"),
        ({"classes": ["a", "a"]}, "unique"),
        ({"classes": ["a", ""]}, "non-empty"),
        ({"name": "a/b"}, "name"),
        ({"num_samples": 231}, "num_samples=231"),
        ({"shards": []}, "shards"),
        ({"mean_image_bytes_per_sample": 11.0}, "mean_image_bytes_per_sample"),
        ({"mean_shard_bytes_per_sample": 1.0}, "mean_shard_bytes_per_sample"),
        ({"shards": _shards_with(name="shards/shard-000005.tar")}, "must be named"),
        ({"shards": _shards_with(name="../x.tar")}, "path segment"),
        ({"shards": _shards_with(first_index=101)}, "first_index"),
        ({"shards": _shards_with(etag="ABC")}, "etag"),
        ({"shards": _shards_with(samples=0)}, "samples"),
        ({"shards": _shards_with(index=2, samples=101, image_bytes=1010)}, "shard_size"),
        ({"num_samples": "many"}, "num_samples"),
    ],
)
def test_manifest_validation_rejects(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidManifestError, match=match):
        parse_manifest(json.dumps(_manifest(**overrides)))


def test_manifest_middle_shard_must_be_full() -> None:
    shards = [_shard(0, 100, 0), _shard(1, 50, 100), _shard(2, 100, 150)]
    with pytest.raises(InvalidManifestError, match="exactly shard_size=100"):
        DatasetManifest.build(name="d", classes=["a"], shards=shards, shard_size=100)


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"null", "\u00e9".encode("latin-1")])
def test_manifest_not_json(data: bytes) -> None:
    with pytest.raises(InvalidManifestError):
        parse_manifest(data)


def test_manifest_too_large() -> None:
    with pytest.raises(InvalidManifestError, match="exceeds the limit"):
        parse_manifest(b" " * (MAX_MANIFEST_BYTES + 1))


def _large_shard(samples: int, image_bytes: int) -> bytearray:
    """A shard of ``samples`` JPEG-headed payloads of ``image_bytes``, as the Swift filter's
    read hands it on: a ``bytearray``."""
    image = JPG[:3] + bytes(range(256)) * (image_bytes // 256)
    members = [
        (f"{sample_key(i)}.{ext}", image if ext == "jpg" else b"1")
        for i in range(samples)
        for ext in ("cls", "jpg")
    ]
    return bytearray(_raw_tar(members))


def test_read_shard_holds_a_read_buffer_once() -> None:
    # Issue 27: a 988 MB shard was held three times (a bytes() copy of the read buffer, then a
    # copy of every member); its images are views of the one buffer now, as it is planned.
    data = _large_shard(8, 2 << 20)
    tracemalloc.start()
    try:
        samples = read_shard(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) // 16, f"{peak} bytes allocated to read a {len(data)}-byte shard"
    assert len(samples) == 8
    for sample in samples:
        image = sample.image_bytes
        assert isinstance(image, memoryview) and image.readonly and image.obj is data
        assert bytes(image[:3]) == JPG[:3] and len(image) == 256 * ((2 << 20) // 256) + 3
