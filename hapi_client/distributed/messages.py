"""Frames of the gradient side channel: fixed ``struct`` headers plus raw float32 payloads.

No pickle: every frame is an envelope ``magic (4s) | kind (B) | body length (Q)`` followed by
the body, in network byte order; tensors travel as little-endian float32 bytes.

- ``HELLO`` (worker -> aggregator, once): protocol version, rank, world size, the run's token.
- ``GRADIENT`` (worker -> aggregator, per round): the round, what the worker measured (samples,
  compute seconds, memory in use, loss sum, correct predictions, bytes and requests so far)
  and, unless the worker dropped its reply, the flat gradient.
- ``UPDATE`` (aggregator -> worker, per round): the round, the batch sizes of the next round,
  an optional parameter checksum and the aggregated gradient.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch

from .errors import ChannelError

__all__ = [
    "ENVELOPE",
    "MAGIC",
    "PROTOCOL_VERSION",
    "TOKEN_BYTES",
    "FrameBuffer",
    "FrameKind",
    "GradientMessage",
    "Hello",
    "UpdateMessage",
    "decode_tensor",
    "encode_tensor",
]

MAGIC = b"HPDW"
PROTOCOL_VERSION = 1
TOKEN_BYTES = 32
ENVELOPE = struct.Struct("!4sBQ")
_HELLO = struct.Struct(f"!HII{TOKEN_BYTES}s")
_GRADIENT = struct.Struct("!QIIBIdddIQQ")
_UPDATE = struct.Struct("!QBQI")
_SIZE = struct.Struct("!I")
_HAS_GRADIENT = 1
_HAS_CHECKSUM = 1


class FrameKind(IntEnum):
    HELLO = 1
    GRADIENT = 2
    UPDATE = 3


def encode_tensor(t: torch.Tensor | None) -> bytes:
    if t is None:
        return b""
    flat = t.detach().reshape(-1).to("cpu", torch.float32).contiguous().numpy()
    return flat.astype("<f4", copy=False).tobytes()


def decode_tensor(data: bytes | memoryview) -> torch.Tensor:
    if len(data) % 4:
        raise ChannelError(f"a float32 payload of {len(data)} bytes is not a multiple of 4")
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))


def _frame(kind: FrameKind, body: bytes) -> bytes:
    return ENVELOPE.pack(MAGIC, int(kind), len(body)) + body


@dataclass(frozen=True)
class Hello:
    rank: int
    world_size: int
    token: bytes
    version: int = PROTOCOL_VERSION

    def encode(self) -> bytes:
        return _frame(
            FrameKind.HELLO, _HELLO.pack(self.version, self.rank, self.world_size, self.token)
        )

    @classmethod
    def decode(cls, body: bytes) -> Hello:
        if len(body) != _HELLO.size:
            raise ChannelError(f"HELLO frame of {len(body)} bytes, expected {_HELLO.size}")
        version, rank, world, token = _HELLO.unpack(body)
        return cls(rank, world, token, version)


@dataclass(frozen=True)
class GradientMessage:
    """One worker's reply for one round (``gradient`` is None when it sends none)."""

    round_index: int
    epoch: int
    rank: int
    samples: int
    compute_seconds: float
    memory_used: float
    loss_sum: float
    correct: int
    wire_bytes: int
    requests: int
    gradient: torch.Tensor | None

    def encode(self) -> bytes:
        head = _GRADIENT.pack(
            self.round_index,
            self.epoch,
            self.rank,
            _HAS_GRADIENT if self.gradient is not None else 0,
            self.samples,
            self.compute_seconds,
            self.memory_used,
            self.loss_sum,
            self.correct,
            self.wire_bytes,
            self.requests,
        )
        return _frame(FrameKind.GRADIENT, head + encode_tensor(self.gradient))

    @classmethod
    def decode(cls, body: bytes | memoryview) -> GradientMessage:
        if len(body) < _GRADIENT.size:
            raise ChannelError(f"GRADIENT frame of {len(body)} bytes is shorter than its header")
        (
            round_index,
            epoch,
            rank,
            flags,
            samples,
            seconds,
            memory,
            loss_sum,
            correct,
            wire,
            requests,
        ) = _GRADIENT.unpack_from(body)
        payload = body[_GRADIENT.size :]
        gradient = decode_tensor(payload) if flags & _HAS_GRADIENT else None
        if gradient is None and len(payload):
            raise ChannelError("GRADIENT frame without a gradient carries a payload")
        return cls(
            round_index,
            epoch,
            rank,
            samples,
            seconds,
            memory,
            loss_sum,
            correct,
            wire,
            requests,
            gradient,
        )


@dataclass(frozen=True)
class UpdateMessage:
    """The aggregator's answer to a round: the aggregated gradient and the next round's sizes."""

    round_index: int
    next_sizes: tuple[int, ...]
    checksum: int | None
    gradient: torch.Tensor

    def encode(self) -> bytes:
        head = _UPDATE.pack(
            self.round_index,
            _HAS_CHECKSUM if self.checksum is not None else 0,
            self.checksum or 0,
            len(self.next_sizes),
        )
        sizes = b"".join(_SIZE.pack(s) for s in self.next_sizes)
        return _frame(FrameKind.UPDATE, head + sizes + encode_tensor(self.gradient))

    @classmethod
    def decode(cls, body: bytes | memoryview) -> UpdateMessage:
        if len(body) < _UPDATE.size:
            raise ChannelError(f"UPDATE frame of {len(body)} bytes is shorter than its header")
        round_index, flags, checksum, count = _UPDATE.unpack_from(body)
        start = _UPDATE.size
        end = start + count * _SIZE.size
        if len(body) < end:
            raise ChannelError(
                f"UPDATE frame announces {count} batch sizes but is {len(body)} bytes"
            )
        sizes = tuple(_SIZE.unpack_from(body, start + i * _SIZE.size)[0] for i in range(count))
        return cls(
            round_index,
            sizes,
            checksum if flags & _HAS_CHECKSUM else None,
            decode_tensor(body[end:]),
        )


class FrameBuffer:
    """Bytes read from a socket so far, cut into complete ``(kind, body)`` frames."""

    def __init__(self, max_body_bytes: int = 1 << 31) -> None:
        self.max_body_bytes = max_body_bytes
        self._data = bytearray()

    def feed(self, data: bytes) -> None:
        self._data += data

    def __len__(self) -> int:
        return len(self._data)

    def pop(self) -> tuple[FrameKind, bytes] | None:
        """The next complete frame, or None; raises :class:`ChannelError` on a malformed envelope."""
        if len(self._data) < ENVELOPE.size:
            return None
        magic, kind, length = ENVELOPE.unpack_from(self._data)
        if magic != MAGIC:
            raise ChannelError(f"bad frame magic {bytes(magic)!r}")
        try:
            frame_kind = FrameKind(kind)
        except ValueError:
            raise ChannelError(f"unknown frame kind {kind}") from None
        if length > self.max_body_bytes:
            raise ChannelError(
                f"frame body of {length} bytes exceeds the limit of {self.max_body_bytes}"
            )
        end = ENVELOPE.size + length
        if len(self._data) < end:
            return None
        body = bytes(self._data[ENVELOPE.size : end])
        del self._data[:end]
        return frame_kind, body
