"""The exception tree of the wire contract.

Request validation itself raises pydantic's ``ValidationError`` (FastAPI turns it into a 422);
everything below is raised by the frame codec and the profile helpers::

    ContractError
    +-- ProfileConversionError      a profile object lacks the fields ProfileSpec needs
    +-- FrameError                  anything wrong with a framed tensor stream
        +-- CorruptFrameError       bad magic/version/JSON/schema/crc, data after the end frame
        +-- OversizedHeaderError    header longer than the decoder's ``max_header_bytes``
        +-- OversizedFrameError     payload longer than the decoder's ``max_payload_bytes``
        +-- TruncatedStreamError    the stream stopped before a matching end frame
        +-- RemoteStreamError       the server sent an error frame after the HTTP status
"""

from __future__ import annotations

__all__ = [
    "ContractError",
    "CorruptFrameError",
    "FrameError",
    "OversizedFrameError",
    "OversizedHeaderError",
    "ProfileConversionError",
    "RemoteStreamError",
    "TruncatedStreamError",
]


class ContractError(Exception):
    """Base class of every error raised by ``hapi_contract``."""


class ProfileConversionError(ContractError):
    """A profile object cannot be converted to a ``ProfileSpec``."""


class FrameError(ContractError):
    """Base class of the framed tensor stream errors."""


class CorruptFrameError(FrameError):
    """A frame is malformed: magic, version, header JSON or schema, checksum, or stray data."""


class OversizedHeaderError(FrameError):
    """A frame header is longer than the decoder accepts."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame header of {length} bytes exceeds the limit of {limit} bytes")
        self.length = length
        self.limit = limit


class OversizedFrameError(FrameError):
    """A frame payload (on the wire or decompressed) is longer than the decoder accepts."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame payload of {length} bytes exceeds the limit of {limit} bytes")
        self.length = length
        self.limit = limit


class TruncatedStreamError(FrameError):
    """The stream ended without an end frame, mid-frame, or with totals that do not match."""


class RemoteStreamError(FrameError):
    """The server reported a failure inside the stream (after the HTTP status was sent)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"server error {status} during the stream: {detail}")
        self.status = status
        self.detail = detail
