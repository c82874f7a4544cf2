"""What the in-place indexer reads from and writes to Swift, behind one small protocol.

The indexer's core (``_index.py``) sees Swift only through :class:`IndexStore`, so that it can be
fed a synthetic listing of ImageNet's size to measure its memory; :class:`SwiftIndexStore` is the
real one, over a python-swiftclient connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from swiftclient.client import Connection
from swiftclient.exceptions import ClientException

from ._swift import is_not_found, swift_errors
from ._upload import put_object_if_changed
from .errors import DatasetNotFoundError

__all__ = ["SWIFT_LISTING_LIMIT", "IndexStore", "ListingEntry", "SwiftIndexStore"]

#: The most names one container listing returns (Swift's container_listing_limit default).
SWIFT_LISTING_LIMIT = 10_000
_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ListingEntry:
    """One object of a container listing, as Swift lists it (no HEAD per object).

    ``large`` marks a static large object (SLO) manifest: its listed ``etag`` is not the MD5 of
    its content, so it cannot be pinned.
    """

    name: str
    etag: str
    bytes: int
    large: bool = False


def _entry(row: dict[str, Any]) -> ListingEntry:
    content_type = str(row.get("content_type", ""))
    return ListingEntry(
        name=str(row["name"]),
        etag=str(row.get("hash", "")).strip('"'),
        bytes=int(row.get("bytes", 0)),
        large="slo_etag" in row or "swift_bytes=" in content_type,
    )


class IndexStore(Protocol):
    """The Swift operations the indexer needs; every name is relative to ``container``."""

    def list_page(self, container: str, prefix: str, marker: str, limit: int) -> list[ListingEntry]:
        """Up to ``limit`` objects under ``prefix`` after ``marker``, by name; [] at the end."""
        ...

    def read(self, container: str, name: str) -> bytes:
        """The whole object."""
        ...

    def read_chunks(self, container: str, name: str) -> Iterator[bytes]:
        """The object in chunks (for a large labels file)."""
        ...

    def exists(self, container: str, name: str) -> bool:
        """Whether the object exists."""
        ...

    def put_if_changed(
        self,
        container: str,
        name: str,
        data: bytes,
        content_type: str,
        before_upload: Callable[[], None] | None = None,
    ) -> bool:
        """Store ``data`` unless identical bytes are there already; True when it was sent.

        ``before_upload`` runs right before a write (not for a skip).
        """
        ...

    def delete(self, container: str, name: str) -> None:
        """Delete the object; one already gone is fine."""
        ...

    def ensure_container(self, container: str) -> None:
        """Create the container if it does not exist."""
        ...


class SwiftIndexStore:
    """:class:`IndexStore` over a swiftclient connection, as its user (errors: this package's)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def list_page(self, container: str, prefix: str, marker: str, limit: int) -> list[ListingEntry]:
        with swift_errors(self.conn, f"GET {container}?prefix={prefix}&marker={marker}"):
            try:
                _, rows = self.conn.get_container(
                    container, prefix=prefix or None, marker=marker or None, limit=limit
                )
            except ClientException as exc:
                if is_not_found(exc):
                    raise DatasetNotFoundError(f"container {container!r} does not exist") from exc
                raise
        return [_entry(row) for row in rows]

    def read(self, container: str, name: str) -> bytes:
        return b"".join(self.read_chunks(container, name))

    def read_chunks(self, container: str, name: str) -> Iterator[bytes]:
        with swift_errors(self.conn, f"GET {container}/{name}"):
            try:
                _, body = self.conn.get_object(container, name, resp_chunk_size=_CHUNK_BYTES)
            except ClientException as exc:
                if is_not_found(exc):
                    raise DatasetNotFoundError(f"object {container}/{name} does not exist") from exc
                raise
            yield from body

    def exists(self, container: str, name: str) -> bool:
        with swift_errors(self.conn, f"HEAD {container}/{name}"):
            try:
                self.conn.head_object(container, name)
            except ClientException as exc:
                if is_not_found(exc):
                    return False
                raise
        return True

    def put_if_changed(
        self,
        container: str,
        name: str,
        data: bytes,
        content_type: str,
        before_upload: Callable[[], None] | None = None,
    ) -> bool:
        return put_object_if_changed(
            self.conn, container, name, data, content_type, before_upload=before_upload
        ).uploaded

    def delete(self, container: str, name: str) -> None:
        with swift_errors(self.conn, f"DELETE {container}/{name}"):
            try:
                self.conn.delete_object(container, name)
            except ClientException as exc:
                if not is_not_found(exc):
                    raise

    def ensure_container(self, container: str) -> None:
        with swift_errors(self.conn, f"HEAD {container}"):
            try:
                self.conn.head_container(container)
                return
            except ClientException as exc:
                if not is_not_found(exc):
                    raise
        with swift_errors(self.conn, f"create container {container!r}"):
            self.conn.put_container(container)
