"""Source spec strings (``get_source``) and cutting sources into shards (``iter_shards``)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from hapi_client.datasets import (
    SOURCE_SPEC_HELP,
    DigitsSource,
    FashionMNISTSource,
    FolderSource,
    PhotoSource,
    SourceError,
    SourceSample,
    SourceSpecError,
    get_source,
    iter_shards,
    list_sources,
)
from hapi_contract.dataset import ShardFormatError, md5_hex, read_shard, shard_name


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        Image.new("L", (3, 3)).save(tmp_path / name / "x.png")
    return tmp_path


def test_list_sources_and_help_name_every_source() -> None:
    assert list_sources() == ["digits", "fashion-mnist", "folder", "photos"]
    for name in list_sources():
        assert name in SOURCE_SPEC_HELP


@pytest.mark.parametrize(
    ("spec", "kind", "length"),
    [
        ("fashion-mnist:train", FashionMNISTSource, 60_000),
        ("fashion-mnist:test?limit=7", FashionMNISTSource, 7),
        ("digits", DigitsSource, 1797),
        ("digits:test", DigitsSource, 359),
        ("digits:train?seed=3&test_fraction=0.5&limit=11", DigitsSource, 11),
        ("photos", PhotoSource, 1000),
        ("photos:test?per_class=3&size=64x48&seed=2&quality=80", PhotoSource, 30),
        ("photos:train?per_class=2&classes=china,flower&workers=1", PhotoSource, 4),
        (" Photos:train?per_class=2 ", PhotoSource, 20),
    ],
)
def test_specs_build_the_named_source(spec: str, kind: type, length: int) -> None:
    source = get_source(spec)
    assert isinstance(source, kind)
    assert len(source) == length


def test_folder_spec(tree: Path) -> None:
    source = get_source(f"folder:{tree}?shuffle=false&limit=1")
    assert isinstance(source, FolderSource)
    assert (source.classes, len(source)) == (("a", "b"), 1)
    assert len(get_source(f"folder:{tree}?seed=4")) == 2


@pytest.mark.parametrize(
    "spec",
    [
        "fashion-mnist:test?limit=7",
        "digits:train?test_fraction=0.3&seed=2",
        "photos:test?per_class=3&size=64x48&seed=2&quality=80&classes=rocket,china",
    ],
)
def test_description_is_a_spec_for_the_same_source(spec: str) -> None:
    source = get_source(spec)
    again = get_source(source.description)
    assert again.description == source.description
    assert len(again) == len(source)


def test_folder_description_round_trips(tree: Path) -> None:
    source = get_source(f"folder:{tree}?shuffle=false")
    assert source.description == f"folder:{tree}?shuffle=false"
    assert get_source(source.description).description == source.description


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("mnist", "unknown source 'mnist'.*known sources: digits, fashion-mnist"),
        ("fashion-mnist", "give a split"),
        ("fashion-mnist:val", "unknown split 'val'"),
        ("digits:valid", "unknown split"),
        ("photos:train?per_clas=3", "unknown key 'per_clas' \\(accepted: per_class"),
        ("photos:train?per_class=many", "per_class='many' is not an integer"),
        ("photos:train?per_class=0", "is not an integer >= 1"),
        ("photos:train?size=500", "is not WIDTHxHEIGHT"),
        ("photos:train?per_class=1&per_class=2", "given twice"),
        ("photos:train?per_class", "malformed keys"),
        ("digits?test_fraction=half", "is not a number"),
        ("folder:/tmp?shuffle=maybe", "is not a boolean"),
        ("folder:", "give the folder"),
        ("folder", "give the folder"),
    ],
)
def test_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(SourceSpecError, match=match):
        get_source(spec)


def test_spec_for_a_missing_folder_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        get_source(f"folder:{tmp_path / 'missing'}")


def test_values_checked_by_the_source_still_fail_clearly() -> None:
    with pytest.raises(SourceError, match="test_fraction"):
        get_source("digits:train?test_fraction=2")


# --- sharding ---------------------------------------------------------------------------------


def _png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (2, 2), value).save(buffer, format="PNG")
    return buffer.getvalue()


def test_iter_shards_sizes_keys_and_etags() -> None:
    samples = [SourceSample(_png(i), "png", i % 3) for i in range(25)]
    shards = list(iter_shards(samples, 10, num_classes=3))
    assert [(s.index, s.samples, s.first_index) for s in shards] == [
        (0, 10, 0),
        (1, 10, 10),
        (2, 5, 20),
    ]
    assert [s.name for s in shards] == [shard_name(i) for i in range(3)]
    last = read_shard(shards[2].data)
    assert [s.key for s in last] == [f"{i:09d}" for i in range(20, 25)]
    assert [s.label for s in last] == [i % 3 for i in range(20, 25)]
    assert [s.image_bytes for s in last] == [_png(i) for i in range(20, 25)]
    for shard in shards:
        info = shard.info()
        assert info.etag == md5_hex(shard.data) == shard.etag
        assert info.bytes == len(shard.data)
        assert info.image_bytes == sum(len(s.image_bytes) for s in read_shard(shard.data))


def test_iter_shards_exact_multiple_and_empty() -> None:
    samples = [SourceSample(_png(i), "png", 0) for i in range(4)]
    assert [s.samples for s in iter_shards(samples, 2, num_classes=1)] == [2, 2]
    assert list(iter_shards([], 2, num_classes=1)) == []


def test_iter_shards_rejects_labels_outside_the_classes() -> None:
    samples = [SourceSample(_png(0), "png", 0), SourceSample(_png(1), "png", 3)]
    with pytest.raises(SourceError, match="sample 1: label 3 outside 0..2"):
        list(iter_shards(samples, 10, num_classes=3))


def test_iter_shards_rejects_non_images() -> None:
    with pytest.raises(ShardFormatError, match="neither JPEG nor PNG"):
        list(iter_shards([SourceSample(b"BM....", "png", 0)], 10, num_classes=1))


def test_iter_shards_rejects_bad_shard_size() -> None:
    with pytest.raises(ValueError, match="shard_size"):
        list(iter_shards([], 0, num_classes=1))
