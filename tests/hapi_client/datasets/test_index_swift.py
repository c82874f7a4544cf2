"""Indexing data already in the real local Swift, in place (session fixture ``swift_stack``)."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import webdataset as wds
from swiftclient.client import Connection

from hapi_cli.main import main
from hapi_client.datasets import (
    DatasetIndexError,
    DatasetNotFoundError,
    IndexInterruptedError,
    IndexRequest,
    SwiftAuthError,
    get_source,
    index_dataset,
    load_manifest,
    sync_index,
)
from hapi_contract.dataset import MANIFEST_NAME, DatasetLayout, md5_hex
from hapi_contract.layouts import parse_part, read_webdataset_shard
from hapi_stack import RunningStack

pytestmark = pytest.mark.swift

PER_CLASS = 4


def _name(tag: str) -> str:
    return f"idx-{tag}-{uuid.uuid4().hex[:8]}"


def _listing(conn: Connection, container: str) -> list[tuple[Any, ...]]:
    _, rows = conn.get_container(container, full_listing=True)
    return [(r["name"], r["hash"], r["bytes"], r["last_modified"]) for r in rows]


@pytest.fixture(scope="module")
def photos(swift_stack: RunningStack) -> Iterator[tuple[str, list[str]]]:
    """A container holding the photos source one object per image, ``train/<class>/NNNN.jpg``."""
    conn = swift_stack.connection()
    container = _name("photos")
    conn.put_container(container)
    source = get_source(f"photos:train?per_class={PER_CLASS}&size=96x72")
    for index, (image, ext, label) in enumerate(source):
        conn.put_object(container, f"train/{source.classes[label]}/{index:04d}.{ext}", image)
    yield container, list(source.classes)
    conn.close()


def _args(stack: RunningStack) -> list[str]:
    return ["--auth-url", stack.auth_url, "--user", stack.admin_user, "--key", stack.admin_key]


def test_folder_index_into_another_container_touches_no_data_object(
    swift_conn: Connection, photos: tuple[str, list[str]], tmp_path: Path
) -> None:
    container, classes = photos
    before = _listing(swift_conn, container)
    into = _name("into")
    manifest = index_dataset(
        swift_conn,
        container,
        layout="folder",
        prefix="train",
        into=into,
        shard_size=15,
        state_dir=tmp_path / "state",
        progress=False,
    )
    assert _listing(swift_conn, container) == before
    assert manifest.classes == sorted(classes)
    assert manifest.num_samples == PER_CLASS * len(classes)
    assert (manifest.name, manifest.data_container) == (into, container)
    assert load_manifest(swift_conn, into) == manifest
    listed = {name: (etag, size) for name, etag, size, _ in before}
    entries = []
    for shard in manifest.shards:
        _, data = swift_conn.get_object(into, shard.name)
        assert (md5_hex(data), len(data)) == (shard.etag, shard.bytes)
        entries += parse_part(data, shard.name, num_classes=manifest.num_classes)
    assert sorted(e.name for e in entries) == sorted(listed)
    for entry in entries:
        assert listed[entry.name] == (entry.etag, entry.bytes)
        assert entry.name.split("/")[1] == manifest.classes[entry.label]
    written = {name for name, *_ in _listing(swift_conn, into)}
    assert written == {MANIFEST_NAME, *(s.name for s in manifest.shards)}


def test_index_in_the_data_container_then_again_writes_nothing(
    swift_conn: Connection, photos: tuple[str, list[str]], tmp_path: Path
) -> None:
    container, _ = photos
    copy = _name("same")
    swift_conn.put_container(copy)
    for name, *_ in _listing(swift_conn, container):
        swift_conn.put_object(copy, name, swift_conn.get_object(container, name)[1])
    data_before = _listing(swift_conn, copy)
    request = IndexRequest(copy, DatasetLayout.FOLDER, prefix="train/", shard_size=16)
    first = sync_index(swift_conn, request, state_dir=tmp_path / "a", progress=False)
    assert first.manifest.data_container is None and first.parts_written == 3
    index_objects = [row for row in _listing(swift_conn, copy) if row not in data_before]
    second = sync_index(swift_conn, request, state_dir=tmp_path / "b", progress=False)
    assert second.manifest == first.manifest
    assert (second.parts_written, second.manifest_written, second.stale_deleted) == (0, False, ())
    assert _listing(swift_conn, copy) == sorted(data_before + index_objects)


def test_an_interrupted_index_continues(
    swift_conn: Connection, photos: tuple[str, list[str]], tmp_path: Path
) -> None:
    container, _ = photos
    request = IndexRequest(container, DatasetLayout.FOLDER, prefix="train/", into=_name("resume"))
    with pytest.raises(IndexInterruptedError, match="after listing 3 pages"):
        sync_index(
            swift_conn,
            request,
            state_dir=tmp_path,
            progress=False,
            page_size=7,
            stop=lambda phase, count: count == 3,
        )
    # Nothing written yet: not even the manifest container was created.
    assert request.manifest_container not in {c["name"] for c in swift_conn.get_account()[1]}
    result = sync_index(swift_conn, request, state_dir=tmp_path, progress=False, page_size=7)
    assert result.resumed and result.objects_listed == PER_CLASS * 10 - 3 * 7
    reference = sync_index(
        swift_conn, request, state_dir=tmp_path / "fresh", progress=False, page_size=1000
    )
    assert reference.manifest == result.manifest and not reference.resumed


def test_bad_objects_and_prefixes_are_named(
    swift_conn: Connection, photos: tuple[str, list[str]], tmp_path: Path
) -> None:
    container, classes = photos
    odd = _name("odd")
    swift_conn.put_container(odd)
    swift_conn.put_object(odd, f"train/{classes[0]}/ok.jpg", b"\xff\xd8\xff not decoded here")
    swift_conn.put_object(odd, f"train/{classes[0]}/notes.txt", b"hello")
    swift_conn.put_object(odd, "train/.DS_Store", b"\0\0\0\1Bud1")
    swift_conn.put_object(odd, f"train/{classes[0]}/empty.jpg", b"")
    with pytest.raises(DatasetIndexError, match="empty.jpg'?: zero bytes") as caught:
        index_dataset(swift_conn, odd, layout="folder", state_dir=tmp_path / "0", progress=False)
    assert caught.value.object_name == f"train/{classes[0]}/empty.jpg"
    swift_conn.delete_object(odd, f"train/{classes[0]}/empty.jpg")
    # Both strays at once, with --strict; skipped, counted and named without it (issue 28 #7).
    with pytest.raises(DatasetIndexError, match="2 objects under 'idx-odd") as caught:
        index_dataset(
            swift_conn, odd, layout="folder", strict=True, state_dir=tmp_path / "1", progress=False
        )
    assert "'train/.DS_Store'" in str(caught.value) and "notes.txt'" in str(caught.value)
    manifest = index_dataset(
        swift_conn, odd, layout="folder", state_dir=tmp_path / "1", progress=False
    )
    assert manifest.num_samples == 1 and manifest.skipped_objects == 2
    assert manifest.skipped_examples == ["train/.DS_Store", f"train/{classes[0]}/notes.txt"]
    with pytest.raises(DatasetIndexError, match="nothing to index under"):
        index_dataset(
            swift_conn, container, layout="folder", prefix="val/", state_dir=tmp_path / "2"
        )
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        index_dataset(swift_conn, _name("missing"), layout="folder", state_dir=tmp_path / "3")


def test_a_second_user_needs_a_read_acl(
    swift_stack: RunningStack,
    swift_conn: Connection,
    photos: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    container, _ = photos
    into = _name("acl")
    swift_conn.put_container(
        into, headers={"X-Container-Read": "test2:tester2", "X-Container-Write": "test2:tester2"}
    )
    other = swift_stack.connection(swift_stack.other_user, account="test", retries=0)
    try:
        with pytest.raises(SwiftAuthError, match=rf"GET {container}\?prefix=train/.*403"):
            index_dataset(
                other, container, layout="folder", prefix="train/", into=into, state_dir=tmp_path
            )
        assert not swift_conn.get_container(into)[1]  # refused before anything was written
        reader = _name("readable")
        swift_conn.put_container(reader, headers={"X-Container-Read": "test2:tester2"})
        for name, *_ in _listing(swift_conn, container)[:12]:
            swift_conn.put_object(reader, name, swift_conn.get_object(container, name)[1])
        manifest = index_dataset(
            other, reader, layout="folder", into=into, state_dir=tmp_path / "b", progress=False
        )
        assert manifest.num_samples == 12
    finally:
        other.close()


def _jpeg(value: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (value, 20, 30)).save(buffer, format="JPEG")
    return buffer.getvalue()


def test_webdataset_shards_written_by_webdataset(swift_conn: Connection, tmp_path: Path) -> None:
    container = _name("wds")
    swift_conn.put_container(container)
    sizes = [5, 3, 4]
    for number, size in enumerate(sizes):
        buffer = io.BytesIO()
        with wds.TarWriter(buffer, compress=number == 1) as writer:
            for i in range(size):
                writer.write(
                    {
                        "__key__": f"shard{number}/sample{i:03d}",
                        "jpeg": _jpeg(10 * number + i),
                        "json": {"label": (number + i) % 3, "caption": "x"},
                        "txt": "a caption, not a label",
                    }
                )
        suffix = ".tar.gz" if number == 1 else ".tar"
        swift_conn.put_object(container, f"wds/train-{number:03d}{suffix}", buffer.getvalue())
    swift_conn.put_object(container, "wds/dataset_info.json", b"{}")
    before = _listing(swift_conn, container)
    into = _name("wds-into")
    request = IndexRequest(
        container, DatasetLayout.WEBDATASET, prefix="wds", label_field="label", into=into
    )
    result = sync_index(swift_conn, request, state_dir=tmp_path, progress=False)
    manifest = result.manifest
    assert _listing(swift_conn, container) == before
    assert result.objects_skipped == 1
    assert [s.samples for s in manifest.shards] == sizes and manifest.shard_size == 5
    assert manifest.classes == ["0", "1", "2"] and manifest.label_field == "label"
    for shard in manifest.shards:
        _, data = swift_conn.get_object(container, shard.name)
        assert (md5_hex(data), len(data)) == (shard.etag, shard.bytes)
        samples = read_webdataset_shard(data, shard.name, label_field="label")
        assert sum(len(s.image_bytes) for s in samples) == shard.image_bytes
    assert {name for name, *_ in _listing(swift_conn, into)} == {MANIFEST_NAME}


def test_cli_index_and_exit_codes(
    swift_stack: RunningStack,
    photos: tuple[str, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    container, classes = photos
    into = _name("cli")
    base = ["dataset", "index", "--container", container, "--layout", "folder", "--no-progress"]
    state = ["--state-dir", str(tmp_path)]
    code = main([*base, "--prefix", "train/", "--into", into, *state, *_args(swift_stack)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"dataset {into!r} (folder layout, data in {container!r})" in out
    assert f"{PER_CLASS * len(classes)} samples, {len(classes)} classes" in out
    assert "hidden or not images" not in out
    swift_conn = swift_stack.connection()
    swift_conn.put_object(container, "train/README.txt", b"read me")
    swift_conn.put_object(container, f"train/{classes[0]}/Thumbs.db", b"thumbs")
    try:
        code = main([*base, "--prefix", "train/", "--into", into, *state, *_args(swift_stack)])
        out = capsys.readouterr().out
        assert code == 0, out
        assert (
            f"  skipped 2 objects, hidden or not images: 'train/README.txt', "
            f"'train/{classes[0]}/Thumbs.db' (--strict refuses them instead)\n"
        ) in out
        code = main(
            [*base, "--prefix", "train/", "--into", into, "--strict", *state, *_args(swift_stack)]
        )
        err = capsys.readouterr().err
        assert code == 2 and "2 objects under" in err and "'train/README.txt'" in err
    finally:
        swift_conn.delete_object(container, "train/README.txt")
        swift_conn.delete_object(container, f"train/{classes[0]}/Thumbs.db")
        swift_conn.close()
    code = main([*base, "--prefix", "nothing/", *state, *_args(swift_stack)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hapi: error: nothing to index") and err.count("\n") == 1
    code = main([*base, "--labels", "missing.csv", *state, *_args(swift_stack)])
    assert code == 2 and "missing.csv does not exist" in capsys.readouterr().err
    assert main(["dataset", "index", "--container", container, "--layout", "tree"]) == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["slo", "dlo"])
def test_large_objects_are_refused_by_name(
    swift_conn: Connection, tmp_path: Path, kind: str
) -> None:
    container = _name(kind)
    swift_conn.put_container(container)
    first = swift_conn.put_object(container, "segments/1", _jpeg(1))
    second = swift_conn.put_object(container, "segments/2", b"rest of the image")
    name = f"train/cat/{kind}.jpg"
    if kind == "slo":
        segments = [
            {"path": f"{container}/segments/1", "etag": first},
            {"path": f"{container}/segments/2", "etag": second},
        ]
        swift_conn.put_object(
            container, name, json.dumps(segments), query_string="multipart-manifest=put"
        )
        match = "static large object"
    else:
        swift_conn.put_object(
            container, name, b"", headers={"X-Object-Manifest": f"{container}/segments/"}
        )
        match = "zero bytes .*DLO manifest"
    with pytest.raises(DatasetIndexError, match=match) as caught:
        index_dataset(swift_conn, container, layout="folder", prefix="train/", state_dir=tmp_path)
    assert caught.value.object_name == name
