"""The framed tensor stream: how split-layer features travel from the server to the client.

A response body (media type ``application/x-hapi-frames``) is a sequence of frames. HTTP chunk
boundaries mean nothing; a reader re-frames the bytes with :class:`FrameDecoder`.

Every frame is ``b"HAPI"``, a version byte (1), a big-endian 32-bit header length, a UTF-8 JSON
header (``kind`` ``batch``, ``end`` or ``error``) and, for a batch, the feature then label bytes
(little-endian). The byte layout, precise enough to write a reader in another language, with a
worked example that the tests decode, is ``docs/frames.md``.

Unknown header keys, kinds, dtypes and codecs are errors, not extensions: a change of format
gets a new version byte. Nothing here ever unpickles. This module imports numpy and zstandard,
so it is not part of the contract's top level: import ``hapi_contract.frames``. Torch is
imported inside the functions that build or read tensors, so that importing the codec (the
Swift proxy filter does, at start) loads no torch.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import threading
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Generator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import zstandard
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from .errors import (
    CorruptFrameError,
    OversizedFrameError,
    OversizedHeaderError,
    RemoteStreamError,
    TruncatedStreamError,
)
from .requests import Compression, OutputDtype

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_MAX_HEADER_BYTES",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "FORMAT_VERSION",
    "MAGIC",
    "BatchFrame",
    "EndFrame",
    "Frame",
    "FrameDecoder",
    "FrameEncoder",
    "aiter_frames",
    "encode_end",
    "encode_error",
    "iter_frames",
]

MAGIC = b"HAPI"
FORMAT_VERSION = 1
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_PAYLOAD_BYTES = 1024**3

_PREFIX = struct.Struct(">4sBI")
_PREFIX_LEN = _PREFIX.size  # 9
_MAX_DIMS = 8
_U32 = 2**32 - 1

_ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
_LABEL_ITEMSIZE = 8
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"


# --- header schema -------------------------------------------------------------------------


class _Header(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_Count = Annotated[StrictInt, Field(ge=0)]
_Crc = Annotated[StrictInt, Field(ge=0, le=_U32)]
_Dim = Annotated[StrictInt, Field(ge=1)]


class _FeaturesHeader(_Header):
    shape: Annotated[list[_Dim], Field(min_length=1, max_length=_MAX_DIMS)]
    dtype: Literal["float32", "float16", "bfloat16"]
    codec: Literal["none", "zstd"]
    nbytes: _Count
    wire_nbytes: _Count
    crc32: _Crc

    @model_validator(mode="after")
    def _sizes(self) -> _FeaturesHeader:
        expected = math.prod(self.shape) * _ITEMSIZE[self.dtype]
        if self.nbytes != expected:
            raise ValueError(
                f"features nbytes {self.nbytes} != shape {self.shape} x {self.dtype} ({expected})"
            )
        if self.codec == "none" and self.wire_nbytes != self.nbytes:
            raise ValueError("uncompressed features must have wire_nbytes == nbytes")
        return self


class _LabelsHeader(_Header):
    shape: Annotated[list[_Dim], Field(min_length=1, max_length=1)]
    dtype: Literal["int64"]
    nbytes: _Count
    crc32: _Crc

    @model_validator(mode="after")
    def _sizes(self) -> _LabelsHeader:
        if self.nbytes != self.shape[0] * _LABEL_ITEMSIZE:
            raise ValueError(f"labels nbytes {self.nbytes} != shape {self.shape} x int64")
        return self


class _BatchHeader(_Header):
    kind: Literal["batch"]
    offset: _Count
    count: _Dim
    features: _FeaturesHeader
    labels: _LabelsHeader
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _counts(self) -> _BatchHeader:
        if self.features.shape[0] != self.count or self.labels.shape[0] != self.count:
            raise ValueError(
                f"count {self.count} disagrees with features shape {self.features.shape} "
                f"or labels shape {self.labels.shape}"
            )
        return self

    @property
    def payload_len(self) -> int:
        return self.features.wire_nbytes + self.labels.nbytes


class _Totals(_Header):
    samples: _Count
    frames: _Count
    payload_bytes: _Count


class _EndHeader(_Header):
    kind: Literal["end"]
    totals: _Totals
    meta: dict[str, Any] = Field(default_factory=dict)


class _ErrorHeader(_Header):
    kind: Literal["error"]
    status: Annotated[StrictInt, Field(ge=100, le=599)]
    detail: StrictStr


_ANY_HEADER: TypeAdapter[_BatchHeader | _EndHeader | _ErrorHeader] = TypeAdapter(
    Annotated[_BatchHeader | _EndHeader | _ErrorHeader, Field(discriminator="kind")]
)


# --- decoded frames ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchFrame:
    """One decoded batch: ``features`` in the wire dtype and int64 ``labels``.

    Both tensors are writable and independent of the decoder's buffers. ``payload_bytes`` is
    what the frame's payload took on the wire (features after compression, plus labels).
    """

    offset: int
    count: int
    features: torch.Tensor
    labels: torch.Tensor
    dtype: OutputDtype
    compression: Compression
    payload_bytes: int
    meta: dict[str, Any] = field(default_factory=dict)

    def float(self) -> torch.Tensor:
        """The features as float32 (a no-op for a float32 stream)."""
        return self.features.float()


@dataclass(frozen=True, slots=True)
class EndFrame:
    """The closing frame: the server's totals and its free-form ``meta``."""

    samples: int
    frames: int
    payload_bytes: int
    meta: dict[str, Any] = field(default_factory=dict)


Frame = BatchFrame | EndFrame


# --- encoding ------------------------------------------------------------------------------

_zstd_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # A ZstdCompressor is not safe to share between threads, and building one per frame costs
    # a context allocation; so keep one per thread and level.
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_zstd_local, "cache", None)
    if cache is None:
        cache = _zstd_local.cache = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _little_endian(array: np.ndarray) -> np.ndarray:
    if _LITTLE_ENDIAN_HOST:
        return array
    return array.astype(array.dtype.newbyteorder("<"))  # pragma: no cover - big-endian hosts


def _feature_array(features: torch.Tensor, dtype: OutputDtype) -> np.ndarray:
    import torch  # the caller holds a tensor, so torch is loaded already: a dict lookup

    # The wire dtypes' names are torch's (float32, float16, bfloat16).
    torch_dtype: torch.dtype = getattr(torch, dtype.value)
    # Cast where the tensor lives (halves a GPU->CPU copy for 16-bit output), then copy to host.
    wire = features.detach().to(dtype=torch_dtype).cpu().contiguous()
    if dtype is OutputDtype.BFLOAT16:
        wire = wire.view(torch.int16)
    return _little_endian(wire.numpy())


def _header_bytes(header: dict[str, Any]) -> bytes:
    try:
        raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"frame header is not strict JSON (check meta): {exc}") from exc
    if len(raw) > DEFAULT_MAX_HEADER_BYTES:
        raise ValueError(
            f"frame header of {len(raw)} bytes exceeds {DEFAULT_MAX_HEADER_BYTES}; shrink meta"
        )
    return raw


def _frame(header: dict[str, Any], *payload: Any) -> bytes:
    raw = _header_bytes(header)
    return b"".join((_PREFIX.pack(MAGIC, FORMAT_VERSION, len(raw)), raw, *payload))


def _encode_batch(
    features: torch.Tensor,
    labels: torch.Tensor,
    offset: int,
    dtype: OutputDtype,
    compression: Compression,
    meta: dict[str, Any] | None,
    zstd_level: int,
) -> tuple[bytes, int, int]:
    import torch

    dtype, compression = OutputDtype(dtype), Compression(compression)
    if not features.is_floating_point():
        raise TypeError(f"features must be a floating tensor, got {features.dtype}")
    if features.dim() < 1 or features.dim() > _MAX_DIMS:
        raise ValueError(f"features must have 1..{_MAX_DIMS} dims, got {features.dim()}")
    if labels.dim() != 1 or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be a 1-D integer tensor, got {labels.dtype} {labels.shape}")
    count = features.shape[0]
    if count < 1 or labels.shape[0] != count or 0 in features.shape:
        raise ValueError(
            f"features {tuple(features.shape)} and labels {tuple(labels.shape)} must hold the "
            "same number (>= 1) of non-empty samples"
        )
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")

    array = _feature_array(features, dtype)
    label_array = _little_endian(labels.detach().to(dtype=torch.int64).cpu().contiguous().numpy())
    raw = array.data.cast("B")
    wire: bytes | memoryview = raw
    if compression is Compression.ZSTD:
        wire = _compressor(zstd_level).compress(raw)
    label_raw = label_array.data.cast("B")
    header = {
        "kind": "batch",
        "offset": offset,
        "count": count,
        "features": {
            "shape": list(features.shape),
            "dtype": dtype.value,
            "codec": compression.value,
            "nbytes": raw.nbytes,
            "wire_nbytes": len(wire),
            "crc32": zlib.crc32(wire),
        },
        "labels": {
            "shape": [count],
            "dtype": "int64",
            "nbytes": label_raw.nbytes,
            "crc32": zlib.crc32(label_raw),
        },
        "meta": dict(meta or {}),
    }
    payload_len = len(wire) + label_raw.nbytes
    return _frame(header, wire, label_raw), count, payload_len


def encode_end(
    *, samples: int, frames: int, payload_bytes: int, meta: dict[str, Any] | None = None
) -> bytes:
    """Encode the end frame with the stream's totals (see the module docstring)."""
    totals = {"samples": samples, "frames": frames, "payload_bytes": payload_bytes}
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in totals.values()):
        raise ValueError(f"totals must be non-negative ints, got {totals}")
    return _frame({"kind": "end", "totals": totals, "meta": dict(meta or {})})


def encode_error(status: int, detail: str) -> bytes:
    """Encode an error frame: the server failed after the HTTP status went out."""
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"status must be an HTTP status code, got {status!r}")
    return _frame({"kind": "error", "status": status, "detail": str(detail)})


class FrameEncoder:
    """Encode one stream and keep the totals its end frame must carry.

    >>> enc = FrameEncoder(dtype=OutputDtype.FLOAT16, compression=Compression.NONE)
    >>> body = [enc.batch(torch.zeros(2, 3), torch.tensor([0, 1]), offset=0), enc.end()]
    """

    def __init__(
        self, *, dtype: OutputDtype, compression: Compression, zstd_level: int = 1
    ) -> None:
        self.dtype = OutputDtype(dtype)
        self.compression = Compression(compression)
        self.zstd_level = zstd_level
        self.samples = 0
        self.frames = 0
        self.payload_bytes = 0

    def batch(
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        offset: int,
        meta: dict[str, Any] | None = None,
    ) -> bytes:
        """Encode a batch frame and count it."""
        frame, count, payload_len = _encode_batch(
            features, labels, offset, self.dtype, self.compression, meta, self.zstd_level
        )
        self.samples += count
        self.frames += 1
        self.payload_bytes += payload_len
        return frame

    def end(self, meta: dict[str, Any] | None = None) -> bytes:
        """Encode the end frame with the totals of every batch encoded so far."""
        return encode_end(
            samples=self.samples, frames=self.frames, payload_bytes=self.payload_bytes, meta=meta
        )

    @staticmethod
    def error(status: int, detail: str) -> bytes:
        """Encode an error frame (same as :func:`encode_error`)."""
        return encode_error(status, detail)


# --- decoding ------------------------------------------------------------------------------


def _decompress_into(wire: np.ndarray, nbytes: int) -> np.ndarray:
    # Decompress into a buffer of exactly the declared size: a frame that claims a small
    # nbytes cannot make us allocate more, whatever its zstd header says.
    out = np.empty(nbytes, dtype=np.uint8)
    view = out.data
    filled = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(wire.data)
        while filled < nbytes:
            got = reader.readinto(view[filled:])
            if got == 0:
                break
            filled += got
        extra = reader.read(1)
    except zstandard.ZstdError as exc:
        raise CorruptFrameError(f"zstd features do not decompress: {exc}") from exc
    if filled != nbytes or extra:
        raise CorruptFrameError(
            f"zstd features decompress to {'more than ' if extra else ''}{filled} bytes, "
            f"header says {nbytes}"
        )
    return out


def _tensor(buffer: np.ndarray, dtype: str, shape: list[int]) -> torch.Tensor:
    """View a fresh, aligned uint8 buffer as a tensor of the wire ``dtype`` (no copy)."""
    import torch  # here, not at the top: a decoder's first frame loads it, its import does not

    wire = np.dtype("<i2") if dtype == "bfloat16" else np.dtype(dtype).newbyteorder("<")
    array = buffer.view(wire)
    if not _LITTLE_ENDIAN_HOST:  # pragma: no cover - big-endian hosts
        array = array.astype(wire.newbyteorder("="))
    tensor = torch.from_numpy(array)
    if dtype == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor.view(shape)


class FrameDecoder:
    """Incremental decoder: feed it the body in chunks of any size, get whole frames back.

    >>> dec = FrameDecoder()
    >>> for chunk in response.iter_bytes():          # doctest: +SKIP
    ...     for frame in dec.feed(chunk): ...
    >>> end = dec.close()                            # doctest: +SKIP

    Every byte is copied once, into the buffer the decoded tensor keeps. The first error
    (corrupt, oversized, error frame) is raised from :meth:`feed`, and the decoder refuses all
    later input; frames decoded earlier in that same ``feed`` call are dropped with it.
    """

    def __init__(
        self,
        *,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if max_header_bytes < 2 or max_payload_bytes < 1:
            raise ValueError("max_header_bytes must be >= 2 and max_payload_bytes >= 1")
        self.max_header_bytes = max_header_bytes
        self.max_payload_bytes = max_payload_bytes
        self._head = bytearray()  # prefix, then prefix + header, of the frame being read
        self._header_len: int | None = None
        self._batch: _BatchHeader | None = None
        self._payload: np.ndarray | None = None
        self._payload_view: memoryview | None = None
        self._filled = 0
        self._end: EndFrame | None = None
        self._failed: Exception | None = None
        self.samples = 0
        self.frames = 0
        self.payload_bytes = 0
        self.bytes_received = 0

    @property
    def end(self) -> EndFrame | None:
        """The end frame, once it has arrived."""
        return self._end

    @property
    def inside_frame(self) -> bool:
        """Whether the bytes fed so far end inside a frame (the next chunk continues it)."""
        return self._payload_view is not None or bool(self._head)

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[Frame]:
        """Consume ``chunk`` and return the frames it completed (possibly none)."""
        if self._failed is not None:
            raise CorruptFrameError(f"the decoder already failed: {self._failed}")
        try:
            return self._feed(memoryview(chunk).cast("B"))
        except Exception as exc:
            self._failed = exc
            raise

    def close(self) -> EndFrame:
        """Check that the stream ended cleanly and return its end frame.

        Raises :class:`TruncatedStreamError` if the stream stopped inside a frame, before the end
        frame, or if the end frame's totals disagree with what was received.
        """
        if self._failed is not None:
            raise TruncatedStreamError(f"the stream failed earlier: {self._failed}")
        if self._payload_view is not None:
            raise TruncatedStreamError(
                f"stream ended inside a frame payload ({self._filled} of {len(self._payload_view)} "
                f"bytes, after {self.frames} frames)"
            )
        if self._head:
            where = "header" if self._header_len is not None else "frame prefix"
            raise TruncatedStreamError(
                f"stream ended inside a {where} ({len(self._head)} bytes, "
                f"after {self.frames} frames)"
            )
        if self._end is None:
            raise TruncatedStreamError(
                f"stream ended without an end frame after {self.frames} frames "
                f"({self.samples} samples)"
            )
        self._check_totals(self._end)
        return self._end

    # -- internals -------------------------------------------------------------------------

    def _feed(self, data: memoryview) -> list[Frame]:
        self.bytes_received += data.nbytes
        frames: list[Frame] = []
        pos, size = 0, data.nbytes
        while pos < size:
            if self._end is not None:
                raise CorruptFrameError(f"{size - pos} bytes of data after the end frame")
            if self._payload_view is not None:
                take = min(len(self._payload_view) - self._filled, size - pos)
                self._payload_view[self._filled : self._filled + take] = data[pos : pos + take]
                self._filled += take
                pos += take
                if self._filled == len(self._payload_view):
                    frames.append(self._finish_batch())
                continue
            need = _PREFIX_LEN if self._header_len is None else _PREFIX_LEN + self._header_len
            take = min(need - len(self._head), size - pos)
            self._head += data[pos : pos + take]
            pos += take
            if self._header_len is None:
                self._check_prefix()
            elif len(self._head) == need:
                frame = self._parse_header()
                if frame is not None:
                    frames.append(frame)
        return frames

    def _check_prefix(self) -> None:
        head = bytes(self._head)
        n = min(len(head), len(MAGIC))
        if head[:n] != MAGIC[:n]:
            raise CorruptFrameError(
                f"bad magic {head[:n]!r} at frame {self.frames + 1} (expected {MAGIC!r}); "
                "is this a HAPI frame stream?"
            )
        if len(head) > len(MAGIC) and head[len(MAGIC)] != FORMAT_VERSION:
            raise CorruptFrameError(
                f"unsupported frame format version {head[len(MAGIC)]} (this reader speaks "
                f"{FORMAT_VERSION})"
            )
        if len(head) == _PREFIX_LEN:
            _, _, header_len = _PREFIX.unpack(head)
            if header_len > self.max_header_bytes:
                raise OversizedHeaderError(header_len, self.max_header_bytes)
            if header_len < 2:
                raise CorruptFrameError(f"frame header of {header_len} bytes cannot be JSON")
            self._header_len = header_len

    def _parse_header(self) -> Frame | None:
        raw = bytes(self._head[_PREFIX_LEN:])
        self._head.clear()
        self._header_len = None
        try:
            header = _ANY_HEADER.validate_json(raw)
        except ValidationError as exc:
            raise CorruptFrameError(f"invalid frame header: {_summarise(exc)}") from exc
        if isinstance(header, _ErrorHeader):
            raise RemoteStreamError(header.status, header.detail)
        if isinstance(header, _EndHeader):
            end = EndFrame(
                samples=header.totals.samples,
                frames=header.totals.frames,
                payload_bytes=header.totals.payload_bytes,
                meta=header.meta,
            )
            self._check_totals(end)
            self._end = end
            return end
        for length in (header.payload_len, header.features.nbytes):
            if length > self.max_payload_bytes:
                raise OversizedFrameError(length, self.max_payload_bytes)
        self._batch = header
        # np.empty, not bytearray: no zero-fill pass over a buffer that is overwritten anyway.
        self._payload = np.empty(header.payload_len, dtype=np.uint8)
        self._payload_view = self._payload.data
        self._filled = 0
        return None

    def _finish_batch(self) -> BatchFrame:
        header, payload = self._batch, self._payload
        assert header is not None and payload is not None
        self._batch, self._payload, self._payload_view, self._filled = None, None, None, 0
        feats, labs = header.features, header.labels
        wire, label_bytes = payload[: feats.wire_nbytes], payload[feats.wire_nbytes :]
        if zlib.crc32(wire.data) != feats.crc32:
            raise CorruptFrameError(f"features crc32 mismatch at offset {header.offset}")
        if zlib.crc32(label_bytes.data) != labs.crc32:
            raise CorruptFrameError(f"labels crc32 mismatch at offset {header.offset}")
        # Labels get their own (8-byte aligned) buffer: after 16-bit features they may sit at
        # an odd offset inside the payload. The features keep the payload buffer when raw.
        labels_buf = label_bytes.copy()
        feature_buf = wire if feats.codec == "none" else _decompress_into(wire, feats.nbytes)
        self.samples += header.count
        self.frames += 1
        self.payload_bytes += header.payload_len
        return BatchFrame(
            offset=header.offset,
            count=header.count,
            features=_tensor(feature_buf, feats.dtype, feats.shape),
            labels=_tensor(labels_buf, "int64", labs.shape),
            dtype=OutputDtype(feats.dtype),
            compression=Compression(feats.codec),
            payload_bytes=header.payload_len,
            meta=header.meta,
        )

    def _check_totals(self, end: EndFrame) -> None:
        got = (self.samples, self.frames, self.payload_bytes)
        if (end.samples, end.frames, end.payload_bytes) != got:
            raise TruncatedStreamError(
                f"end frame totals (samples={end.samples}, frames={end.frames}, "
                f"payload_bytes={end.payload_bytes}) do not match what arrived "
                f"(samples={got[0]}, frames={got[1]}, payload_bytes={got[2]})"
            )


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "<header>"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def iter_frames(
    chunks: Iterable[bytes],
    *,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Generator[BatchFrame, None, EndFrame]:
    """Yield the batch frames of a whole body; the generator's return value is the end frame.

    Raises like :class:`FrameDecoder`, including :class:`TruncatedStreamError` at the end.
    """
    decoder = FrameDecoder(max_header_bytes=max_header_bytes, max_payload_bytes=max_payload_bytes)
    for chunk in chunks:
        for frame in decoder.feed(chunk):
            if isinstance(frame, BatchFrame):
                yield frame
    return decoder.close()


async def aiter_frames(
    chunks: AsyncIterable[bytes],
    *,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> AsyncIterator[BatchFrame]:
    """Async twin of :func:`iter_frames` (e.g. over httpx ``aiter_bytes()``); checks the end."""
    decoder = FrameDecoder(max_header_bytes=max_header_bytes, max_payload_bytes=max_payload_bytes)
    async for chunk in chunks:
        for frame in decoder.feed(chunk):
            if isinstance(frame, BatchFrame):
                yield frame
    decoder.close()
