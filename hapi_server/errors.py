"""Exception tree of the HAPI server: each error knows its HTTP status and a machine code."""

from __future__ import annotations


class HapiServerError(Exception):
    status: int = 500
    code: str = "internal_error"

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class UnauthorizedError(HapiServerError):
    status, code = 401, "unauthorized"


class ForbiddenError(HapiServerError):
    status, code = 403, "forbidden"


class NotFoundError(HapiServerError):
    status, code = 404, "not_found"


class ChecksumError(HapiServerError):
    status, code = 409, "sha256_mismatch"


class PayloadTooLargeError(HapiServerError):
    status, code = 413, "too_large"


class InvalidRequestError(HapiServerError):
    status, code = 422, "invalid_request"


class InvalidShardError(HapiServerError):
    status, code = 422, "invalid_shard"


class QueueFullError(HapiServerError):
    status, code = 503, "queue_full"


class SwiftUnavailableError(HapiServerError):
    status, code = 502, "swift_unavailable"


class RequestTimeoutError(HapiServerError):
    status, code = 504, "timeout"


class InsufficientMemoryError(HapiServerError):
    status, code = 507, "insufficient_memory"
