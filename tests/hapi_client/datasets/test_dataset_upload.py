"""Uploading datasets into the real local Swift (session fixture ``swift_stack``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from swiftclient.client import Connection

from hapi_client.datasets import (
    CorruptDatasetError,
    DatasetNotFoundError,
    DigitsSource,
    ImageSource,
    SourceError,
    SourceSample,
    SwiftAuthError,
    load_manifest,
    put_object_idempotent,
    put_object_if_changed,
    sync_dataset,
    upload_dataset,
)
from hapi_contract.dataset import MANIFEST_NAME, md5_hex, read_shard, shard_name
from hapi_stack import RunningStack

pytestmark = pytest.mark.swift


class CountingConnection(Connection):
    """A real Connection that also counts the object writes it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.puts: list[str] = []
        self.deletes: list[str] = []

    def put_object(self, container: str, obj: str, *args: Any, **kwargs: Any) -> Any:
        self.puts.append(obj)
        return super().put_object(container, obj, *args, **kwargs)

    def delete_object(self, container: str, obj: str, *args: Any, **kwargs: Any) -> Any:
        self.deletes.append(obj)
        return super().delete_object(container, obj, *args, **kwargs)


@pytest.fixture
def conn(swift_stack: RunningStack) -> Iterator[CountingConnection]:
    connection = CountingConnection(
        authurl=swift_stack.auth_url, user=swift_stack.admin_user, key=swift_stack.admin_key
    )
    yield connection
    connection.close()


@pytest.fixture
def container() -> str:
    return f"ds-{uuid.uuid4().hex[:10]}"


def _listing(conn: Connection, container: str) -> dict[str, dict[str, Any]]:
    _, objects = conn.get_container(container, full_listing=True)
    return {entry["name"]: entry for entry in objects}


def _timestamps(conn: Connection, container: str) -> dict[str, str]:
    return {
        name: conn.head_object(container, name)["x-timestamp"] for name in _listing(conn, container)
    }


def test_upload_writes_shards_and_manifest(conn: CountingConnection, container: str) -> None:
    source = DigitsSource("train", limit=250)
    result = sync_dataset(conn, source, container, shard_size=100, progress=False)
    manifest = result.manifest
    assert (result.shards_uploaded, result.shards_skipped, result.manifest_uploaded) == (3, 0, True)
    assert result.stale_deleted == ()
    assert conn.puts == [shard_name(0), shard_name(1), shard_name(2), MANIFEST_NAME]
    assert manifest.name == container and manifest.source == source.description
    assert manifest.num_samples == 250 and manifest.classes == list(source.classes)
    assert [s.samples for s in manifest.shards] == [100, 100, 50]
    assert result.bytes_uploaded == manifest.total_bytes

    listing = _listing(conn, container)
    assert set(listing) == {shard_name(0), shard_name(1), shard_name(2), MANIFEST_NAME}
    for shard in manifest.shards:  # the manifest's etags are Swift's own hashes
        assert (listing[shard.name]["hash"], listing[shard.name]["bytes"]) == (
            shard.etag,
            shard.bytes,
        )
        assert listing[shard.name]["content_type"] == "application/x-tar"
    assert load_manifest(conn, container) == manifest

    stored = [
        s
        for shard in manifest.shards
        for s in read_shard(conn.get_object(container, shard.name)[1])
    ]
    assert [(s.image_bytes, s.label) for s in stored] == [(s.image, s.label) for s in source]
    assert [s.key for s in stored] == [f"{i:09d}" for i in range(250)]


def test_reupload_of_the_same_source_sends_nothing(
    conn: CountingConnection, container: str
) -> None:
    first = upload_dataset(
        conn, DigitsSource("test", limit=120), container, shard_size=50, progress=False
    )
    before = _timestamps(conn, container)
    conn.puts.clear()

    again = sync_dataset(
        conn, DigitsSource("test", limit=120), container, shard_size=50, progress=True
    )
    assert conn.puts == [] and conn.deletes == []
    assert (again.shards_uploaded, again.shards_skipped, again.manifest_uploaded) == (0, 3, False)
    assert again.bytes_uploaded == 0 and not again.changed
    assert again.manifest == first
    assert _timestamps(conn, container) == before


def test_changed_source_replaces_shards_and_deletes_stale_ones(
    conn: CountingConnection, container: str
) -> None:
    upload_dataset(
        conn, DigitsSource("train", limit=250), container, shard_size=100, progress=False
    )
    before = _timestamps(conn, container)
    conn.puts.clear()

    # The first 100 samples are the same, the next 50 differ, and there is no third shard.
    result = sync_dataset(
        conn, _Prefix(DigitsSource("train", limit=100), DigitsSource("test", limit=50)),
        container, shard_size=100, progress=False,
    )  # fmt: skip
    assert (result.shards_uploaded, result.shards_skipped) == (1, 1)
    assert result.manifest_uploaded and result.stale_deleted == (shard_name(2),)
    assert conn.puts == [shard_name(1), MANIFEST_NAME]
    # The old manifest went first (before the changed shard), the stale shard last.
    assert conn.deletes == [MANIFEST_NAME, shard_name(2)]

    listing = _listing(conn, container)
    assert set(listing) == {shard_name(0), shard_name(1), MANIFEST_NAME}
    assert _timestamps(conn, container)[shard_name(0)] == before[shard_name(0)]
    manifest = load_manifest(conn, container)
    assert manifest == result.manifest and manifest.num_samples == 150
    assert [listing[s.name]["hash"] for s in manifest.shards] == [s.etag for s in manifest.shards]


def test_interrupted_change_leaves_no_stale_manifest(
    conn: CountingConnection, container: str
) -> None:
    upload_dataset(conn, DigitsSource("train", limit=40), container, shard_size=10, progress=False)
    with pytest.raises(SourceError, match="disk on fire"):
        sync_dataset(
            conn, _Failing(DigitsSource("test", limit=40), after=25), container,
            shard_size=10, progress=False,
        )  # fmt: skip
    # Shards 0 and 1 changed before the failure: the old manifest must not describe them.
    with pytest.raises(DatasetNotFoundError, match="has no manifest.json"):
        load_manifest(conn, container)
    # Running it again to completion repairs the dataset.
    result = sync_dataset(
        conn, DigitsSource("test", limit=40), container, shard_size=10, progress=False
    )
    assert result.shards_skipped == 2 and result.shards_uploaded == 2
    assert load_manifest(conn, container).num_samples == 40


def test_empty_source_is_refused(conn: CountingConnection, container: str) -> None:
    with pytest.raises(SourceError, match="yielded no samples"):
        sync_dataset(conn, _Prefix(), container, progress=False)


def test_load_manifest_errors(conn: CountingConnection, container: str) -> None:
    with pytest.raises(DatasetNotFoundError, match=f"container '{container}' does not exist"):
        load_manifest(conn, container)
    conn.put_container(container)
    with pytest.raises(DatasetNotFoundError, match="has no manifest.json"):
        load_manifest(conn, container)
    conn.put_object(container, MANIFEST_NAME, b"{not json", content_type="application/json")
    with pytest.raises(CorruptDatasetError, match=f"{container}/manifest.json: invalid manifest"):
        load_manifest(conn, container)
    conn.put_object(container, MANIFEST_NAME, json.dumps({"format_version": 1}))
    with pytest.raises(CorruptDatasetError, match="num_samples"):
        load_manifest(conn, container)


def test_other_user_is_denied(
    swift_stack: RunningStack, conn: CountingConnection, container: str
) -> None:
    upload_dataset(conn, DigitsSource("train", limit=10), container, progress=False)
    outsider = swift_stack.connection(swift_stack.other_user, account="test", retries=0)
    try:
        with pytest.raises(SwiftAuthError, match="403 Forbidden"):
            load_manifest(outsider, container)
    finally:
        outsider.close()


def test_put_object_idempotent(conn: CountingConnection, container: str) -> None:
    conn.put_container(container)
    data = b"weights" * 1000
    assert put_object_idempotent(
        conn, container, "m.safetensors", data, "application/octet-stream"
    ) == md5_hex(data)
    stamp = conn.head_object(container, "m.safetensors")["x-timestamp"]
    assert put_object_idempotent(
        conn, container, "m.safetensors", data, "application/octet-stream"
    ) == md5_hex(data)
    assert conn.puts == ["m.safetensors"]
    assert conn.head_object(container, "m.safetensors")["x-timestamp"] == stamp
    changed = put_object_if_changed(
        conn, container, "m.safetensors", data + b"!", "application/octet-stream"
    )
    assert changed.uploaded and changed.etag == md5_hex(data + b"!")
    headers, body = conn.get_object(container, "m.safetensors")
    assert body == data + b"!" and headers["content-type"] == "application/octet-stream"


class _Prefix(ImageSource):
    """The samples of several sources in a row (labels kept)."""

    def __init__(self, *parts: ImageSource) -> None:
        super().__init__(parts[0].classes if parts else ("a",), "prefix")
        self._parts = parts

    def __len__(self) -> int:
        return sum(len(part) for part in self._parts)

    def __iter__(self) -> Iterator[SourceSample]:
        for part in self._parts:
            yield from part


class _Failing(ImageSource):
    """A source that breaks after ``after`` samples, as a failing disk would."""

    def __init__(self, inner: ImageSource, after: int) -> None:
        super().__init__(inner.classes, "failing")
        self._inner, self._after = inner, after

    def __len__(self) -> int:
        return len(self._inner)

    def __iter__(self) -> Iterator[SourceSample]:
        for index, sample in enumerate(self._inner):
            if index == self._after:
                raise SourceError("disk on fire")
            yield sample
