"""Idempotent upload of a dataset (shards, then the manifest) into a Swift container."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from swiftclient.client import Connection
from swiftclient.exceptions import ClientException
from tqdm import tqdm

from hapi_contract.dataset import (
    DEFAULT_SHARD_SIZE,
    MANIFEST_CONTENT_TYPE,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SHARD_CONTENT_TYPE,
    SHARD_PREFIX,
    DatasetManifest,
    InvalidManifestError,
    ShardInfo,
    md5_hex,
    parse_manifest,
)

from ._sharding import iter_shards
from ._source import ImageSource
from ._swift import is_not_found, swift_errors
from .errors import CorruptDatasetError, DatasetError, DatasetNotFoundError, SourceError

__all__ = [
    "PutResult",
    "UploadResult",
    "load_manifest",
    "put_object_idempotent",
    "put_object_if_changed",
    "sync_dataset",
    "upload_dataset",
]

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1024 * 1024
_MAX_CONTAINER_NAME = 256


@dataclass(frozen=True)
class PutResult:
    """What :func:`put_object_if_changed` did: the object's ``etag`` and whether it was sent."""

    etag: str
    uploaded: bool


@dataclass(frozen=True)
class UploadResult:
    """What :func:`sync_dataset` did."""

    manifest: DatasetManifest
    shards_uploaded: int
    shards_skipped: int
    bytes_uploaded: int
    manifest_uploaded: bool
    stale_deleted: tuple[str, ...]
    seconds: float

    @property
    def changed(self) -> bool:
        """True when anything in the container was written or deleted."""
        return bool(self.shards_uploaded or self.manifest_uploaded or self.stale_deleted)


class _CountingReader(io.BytesIO):
    """A seekable body (so swiftclient can retry a PUT) that reports the bytes read."""

    def __init__(self, data: bytes, on_bytes: Callable[[int], None] | None) -> None:
        super().__init__(data)
        self._on_bytes = on_bytes

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        if chunk and self._on_bytes is not None:
            self._on_bytes(len(chunk))
        return chunk


def _check_container(container: str) -> None:
    if not container or "/" in container or len(container) > _MAX_CONTAINER_NAME:
        raise DatasetError(
            f"invalid container name {container!r}: 1-{_MAX_CONTAINER_NAME} characters, no '/'"
        )


def _stored_etag(conn: Connection, container: str, name: str) -> tuple[str, int] | None:
    """(etag, size) of an existing object, or None when it does not exist."""
    with swift_errors(conn, f"HEAD {container}/{name}"):
        try:
            headers = conn.head_object(container, name)
        except ClientException as exc:
            if is_not_found(exc):
                return None
            raise
    return headers.get("etag", "").strip('"'), int(headers.get("content-length", -1))


def put_object_if_changed(
    conn: Connection,
    container: str,
    name: str,
    data: bytes,
    content_type: str,
    *,
    on_bytes: Callable[[int], None] | None = None,
    before_upload: Callable[[], None] | None = None,
) -> PutResult:
    """Store ``data`` as ``container/name`` unless an identical object is already there.

    Identical means: the stored etag (HEAD) equals the MD5 of ``data`` and the sizes match. The
    PUT carries the MD5 as ``ETag``, so Swift itself rejects a body damaged in transit.
    ``on_bytes`` is called with the size of each chunk sent; ``before_upload`` right before a
    PUT (not for a skip). The container must exist.

    Raises:
        SwiftError: (a subclass for) the HEAD or PUT failed.
    """
    etag = md5_hex(data)
    if _stored_etag(conn, container, name) == (etag, len(data)):
        logger.debug("skip %s/%s: etag %s already stored", container, name, etag)
        return PutResult(etag, uploaded=False)
    if before_upload is not None:
        before_upload()
    with swift_errors(conn, f"PUT {container}/{name}"):
        stored = conn.put_object(
            container,
            name,
            _CountingReader(data, on_bytes),
            content_length=len(data),
            etag=etag,
            chunk_size=_CHUNK_BYTES,
            content_type=content_type,
        )
    logger.debug("put %s/%s: %d bytes, etag %s", container, name, len(data), stored)
    return PutResult(str(stored).strip('"') or etag, uploaded=True)


def put_object_idempotent(
    conn: Connection, container: str, name: str, data: bytes, content_type: str
) -> str:
    """Store ``data`` as ``container/name`` unless it is already there; return the etag (MD5).

    Re-running with the same bytes sends nothing (one HEAD). The container must exist.

    Raises:
        SwiftError: (a subclass for) the HEAD or PUT failed.
    """
    return put_object_if_changed(conn, container, name, data, content_type).etag


def sync_dataset(
    conn: Connection,
    source: ImageSource,
    container: str,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    progress: bool = True,
) -> UploadResult:
    """Make ``container`` hold ``source`` as a dataset; send only what differs.

    Order of writes, so that a reader never sees a manifest listing a missing or different
    shard: the container is created; each shard is built in memory and PUT unless the stored
    etag already matches; before the first shard that changes, an existing manifest is deleted
    (a reader then sees "no dataset yet" instead of a stale one); the new manifest is PUT last
    (skipped if identical); finally objects under ``shards/`` that the new manifest does not list
    (left over from a longer earlier version) are deleted.

    Raises:
        SourceError: the source yields nothing or cannot be read.
        ShardFormatError: a sample cannot be stored.
        SwiftError: (a subclass for) any Swift request failed.
    """
    _check_container(container)
    started = time.perf_counter()
    with swift_errors(conn, f"create container {container!r}"):
        conn.put_container(container)
    manifest_stored = _stored_etag(conn, container, MANIFEST_NAME) is not None

    def invalidate_manifest() -> None:
        nonlocal manifest_stored
        if not manifest_stored:
            return
        logger.info("%s: content changed, removing the old manifest first", container)
        with swift_errors(conn, f"DELETE {container}/{MANIFEST_NAME}"):
            try:
                conn.delete_object(container, MANIFEST_NAME)
            except ClientException as exc:
                if not is_not_found(exc):
                    raise
        manifest_stored = False

    shards: list[ShardInfo] = []
    uploaded = skipped = bytes_uploaded = samples_done = 0
    with tqdm(
        total=None,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"upload {container}",
        disable=not progress,
        leave=False,
    ) as bar:
        for shard in iter_shards(source, shard_size, num_classes=len(source.classes)):
            put = put_object_if_changed(
                conn,
                container,
                shard.name,
                shard.data,
                SHARD_CONTENT_TYPE,
                on_bytes=bar.update,
                before_upload=invalidate_manifest,
            )
            if put.uploaded:
                uploaded += 1
                bytes_uploaded += len(shard.data)
            else:
                skipped += 1
                bar.update(len(shard.data))
            shards.append(shard.info())
            samples_done += shard.samples
            # Sizes are known only once built: extrapolate the total from what is done so far.
            bar.total = round(bar.n * max(len(source), samples_done) / samples_done)
            bar.set_postfix(uploaded=uploaded, skipped=skipped, refresh=False)
        if not shards:
            raise SourceError(f"source {source.description!r} yielded no samples")
        manifest = DatasetManifest.build(
            name=container,
            classes=source.classes,
            shards=shards,
            shard_size=shard_size,
            source=source.description,
        )
        body = manifest.to_json()
        manifest_result = put_object_if_changed(
            conn, container, MANIFEST_NAME, body, MANIFEST_CONTENT_TYPE
        )
    stale = _delete_stale_shards(conn, container, {s.name for s in shards})
    outcome = UploadResult(
        manifest=manifest,
        shards_uploaded=uploaded,
        shards_skipped=skipped,
        bytes_uploaded=bytes_uploaded,
        manifest_uploaded=manifest_result.uploaded,
        stale_deleted=stale,
        seconds=time.perf_counter() - started,
    )
    logger.info(
        "%s: %d samples in %d shards (%d uploaded, %d unchanged, %d stale deleted) in %.1f s",
        container,
        manifest.num_samples,
        len(shards),
        uploaded,
        skipped,
        len(stale),
        outcome.seconds,
    )
    return outcome


def _delete_stale_shards(conn: Connection, container: str, keep: set[str]) -> tuple[str, ...]:
    with swift_errors(conn, f"GET {container}?prefix={SHARD_PREFIX}"):
        _, listing = conn.get_container(container, prefix=SHARD_PREFIX, full_listing=True)
    stale = tuple(sorted(entry["name"] for entry in listing if entry["name"] not in keep))
    for name in stale:
        with swift_errors(conn, f"DELETE {container}/{name}"):
            try:
                conn.delete_object(container, name)
            except ClientException as exc:
                if not is_not_found(exc):
                    raise
        logger.debug("deleted stale %s/%s", container, name)
    return stale


def upload_dataset(
    conn: Connection,
    source: ImageSource,
    container: str,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    progress: bool = True,
) -> DatasetManifest:
    """Upload ``source`` into ``container`` as shards plus a manifest; return the manifest.

    Idempotent: re-running with the same source sends no shard and no manifest (only HEADs).
    See :func:`sync_dataset` for the order of writes and for the counts of what was sent.
    """
    return sync_dataset(conn, source, container, shard_size=shard_size, progress=progress).manifest


def load_manifest(conn: Connection, container: str) -> DatasetManifest:
    """Read and validate ``container/manifest.json``.

    Raises:
        DatasetNotFoundError: the container, or its manifest, does not exist.
        CorruptDatasetError: the manifest is too large, not JSON, or not a valid manifest.
        SwiftError: (a subclass for) another Swift failure.
    """
    _check_container(container)
    with swift_errors(conn, f"GET {container}/{MANIFEST_NAME}"):
        try:
            headers, body = conn.get_object(container, MANIFEST_NAME, resp_chunk_size=_CHUNK_BYTES)
        except ClientException as exc:
            if not is_not_found(exc):
                raise
            if _container_exists(conn, container):
                raise DatasetNotFoundError(
                    f"container {container!r} has no {MANIFEST_NAME} (never uploaded, or an "
                    "upload is in progress or was interrupted): run `hapi upload dataset`"
                ) from exc
            raise DatasetNotFoundError(f"dataset container {container!r} does not exist") from exc
        size = int(headers.get("content-length", 0))
        if size > MAX_MANIFEST_BYTES:
            body.close()
            raise CorruptDatasetError(
                f"{container}/{MANIFEST_NAME}: {size} bytes exceeds the limit of "
                f"{MAX_MANIFEST_BYTES} bytes"
            )
        data = bytearray()
        for chunk in body:
            data += chunk
            if len(data) > MAX_MANIFEST_BYTES:
                body.close()
                raise CorruptDatasetError(
                    f"{container}/{MANIFEST_NAME} exceeds the limit of {MAX_MANIFEST_BYTES} bytes"
                )
    try:
        return parse_manifest(bytes(data))
    except InvalidManifestError as exc:
        raise CorruptDatasetError(f"{container}/{MANIFEST_NAME}: {exc}") from exc


def _container_exists(conn: Connection, container: str) -> bool:
    with swift_errors(conn, f"HEAD {container}"):
        try:
            conn.head_container(container)
        except ClientException as exc:
            if is_not_found(exc):
                return False
            raise
    return True
