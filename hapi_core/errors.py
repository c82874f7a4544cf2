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


class InvalidNameError(InvalidRequestError):
    """A Swift name the server will not put in a URL (a ``.`` or ``..`` path segment)."""

    code = "invalid_name"


class InvalidShardError(HapiServerError):
    status, code = 422, "invalid_shard"


class StorageRefusedError(HapiServerError):
    """Swift answered a 4xx that has no class of its own here: its status is passed on.

    The status is per instance (Swift's own), so that a client sees what Swift said (e.g. 400,
    412, 429) rather than a 502 that would blame an outage that did not happen.
    """

    code = "swift_refused"

    def __init__(self, detail: str, status: int, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail, headers=headers)
        self.status = status


class QueueFullError(HapiServerError):
    status, code = 503, "queue_full"


class StorageUnavailableError(HapiServerError):
    status, code = 502, "swift_unavailable"


class RequestTimeoutError(HapiServerError):
    status, code = 504, "timeout"


class InsufficientMemoryError(HapiServerError):
    status, code = 507, "insufficient_memory"
