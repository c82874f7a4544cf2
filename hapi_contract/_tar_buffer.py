"""A tar archive held in memory, read without copying it.

A shard is read whole into one buffer (the Swift filter's read is a ``bytearray``, issue 27)
and its members are handed on as read-only views of that buffer, so a shard costs its size
once, as it is planned: ``tarfile`` over ``io.BytesIO`` copied a ``bytearray`` whole, and each
``extractfile().read()`` copied its member again (a 988 MB shard held up to three times).
"""

from __future__ import annotations

import io
import tarfile
from typing import TypeAlias

#: Encoded image bytes as a reader hands them on: a view of the buffer they were read into
#: (a shard's tar) or the buffer itself (a ``folder`` image). Read-only by convention.
ImageData: TypeAlias = bytes | bytearray | memoryview


class BufferReader(io.RawIOBase):
    """A seekable, read-only file over a buffer that never copies it whole.

    The standard library has none: ``io.BytesIO`` shares only a ``bytes`` object and copies
    anything else at construction; ``tarfile`` reads headers through this one (512 bytes at a
    time) and the payloads are sliced from :attr:`view` instead.
    """

    def __init__(self, data: ImageData) -> None:
        super().__init__()
        self.view = memoryview(data).cast("B").toreadonly()
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self.view) - self._pos))
        out[:n] = self.view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self.view)}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


def open_tar(data: ImageData) -> tuple[tarfile.TarFile, memoryview]:
    """``data`` opened as an uncompressed tar, and the read-only view its members slice.

    Raises:
        tarfile.TarError, EOFError: as :func:`tarfile.open` does (the callers name the shard).
    """
    reader = BufferReader(data)
    return tarfile.open(fileobj=reader, mode="r:"), reader.view


def member_bytes(view: memoryview, member: tarfile.TarInfo) -> memoryview:
    """The payload of ``member`` as a view of ``view``: shorter than ``member.size`` when the
    archive is truncated (the callers check)."""
    return view[member.offset_data : member.offset_data + member.size]
