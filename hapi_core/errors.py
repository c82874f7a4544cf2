"""Exception tree of the extraction core: each error knows its HTTP status and a machine code.

Both hosts answer these as they are: the HAPI server as ``{"detail", "code"}`` JSON with the
status, the Swift filter's in-proxy execution likewise, so one refusal reads the same in both::

    HapiCoreError                  500 internal_error
    ├── UnauthorizedError          401 unauthorized
    ├── ForbiddenError             403 forbidden
    ├── NotFoundError              404 not_found
    ├── ChecksumError              409 sha256_mismatch
    ├── ObjectChangedError         409 object_changed
    ├── PayloadTooLargeError       413 too_large
    ├── InvalidRequestError        422 invalid_request
    │   └── InvalidNameError       422 invalid_name
    ├── InvalidShardError          422 invalid_shard
    ├── StorageRefusedError        Swift's own 4xx, swift_refused
    ├── QueueFullError             503 queue_full
    ├── StorageUnavailableError    502 swift_unavailable
    ├── RequestTimeoutError        504 timeout
    └── InsufficientMemoryError    507 insufficient_memory
"""

from __future__ import annotations


class HapiCoreError(Exception):
    """Base of every refusal of the core and its hosts."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class UnauthorizedError(HapiCoreError):
    status, code = 401, "unauthorized"


class ForbiddenError(HapiCoreError):
    status, code = 403, "forbidden"


class NotFoundError(HapiCoreError):
    status, code = 404, "not_found"


class ChecksumError(HapiCoreError):
    status, code = 409, "sha256_mismatch"


class ObjectChangedError(HapiCoreError):
    """An object of a dataset indexed in place is not what its index pinned (size or MD5):
    changed, overwritten or replaced since. 409, as the request conflicts with the object's
    current state; 412 would say a precondition of the caller's own failed, and the caller
    sent none."""

    status, code = 409, "object_changed"


class PayloadTooLargeError(HapiCoreError):
    status, code = 413, "too_large"


class InvalidRequestError(HapiCoreError):
    status, code = 422, "invalid_request"


class InvalidNameError(InvalidRequestError):
    """A Swift name the server will not put in a URL (a ``.`` or ``..`` path segment)."""

    code = "invalid_name"


class InvalidShardError(HapiCoreError):
    status, code = 422, "invalid_shard"


class StorageRefusedError(HapiCoreError):
    """Swift answered a 4xx that has no class of its own here: its status is passed on.

    The status is per instance (Swift's own), so that a client sees what Swift said (e.g. 400,
    412, 429) rather than a 502 that would blame an outage that did not happen.
    """

    code = "swift_refused"

    def __init__(self, detail: str, status: int, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail, headers=headers)
        self.status = status


class QueueFullError(HapiCoreError):
    status, code = 503, "queue_full"


class StorageUnavailableError(HapiCoreError):
    status, code = 502, "swift_unavailable"


class RequestTimeoutError(HapiCoreError):
    status, code = 504, "timeout"


class InsufficientMemoryError(HapiCoreError):
    status, code = 507, "insufficient_memory"
