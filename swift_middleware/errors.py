"""Exceptions of :mod:`swift_middleware`.

Every error the filter answers with carries its HTTP status and a machine ``code``; the filter
turns it into a JSON body ``{"detail": ..., "code": ...}`` (the contract's ``ErrorBody``). In
``in_proxy`` execution the extraction core's own refusals (``hapi_core.errors``) are answered
as a ``HapiResponseError`` with their status and code unchanged::

    HapiMiddlewareError
    ├── FilterConfigError      a bad option in the proxy's [filter:hapi] section (startup)
    └── HapiResponseError      anything answered to a client with a status
        ├── BadHapiRequestError     malformed HAPI request (400, 405, 411, 413, 415, 422)
        ├── SwiftDeniedError        the caller may not read the object (401, 403, 404, ...)
        ├── NoHapiServerError       every configured HAPI server is down (503)
        └── UpstreamError           a HAPI server failed mid-request (502)
"""

from __future__ import annotations

__all__ = [
    "BadHapiRequestError",
    "FilterConfigError",
    "HapiMiddlewareError",
    "HapiResponseError",
    "NoHapiServerError",
    "SwiftDeniedError",
    "UpstreamError",
]


class HapiMiddlewareError(Exception):
    """Base class of everything :mod:`swift_middleware` raises on purpose."""


class FilterConfigError(HapiMiddlewareError, ValueError):
    """An option of the filter's paste section is missing or invalid."""


class HapiResponseError(HapiMiddlewareError):
    """An error answered to the client: ``status``, a machine ``code`` and a human ``detail``."""

    status: int = 500
    code: str = "internal_error"

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})


class BadHapiRequestError(HapiResponseError):
    """The HAPI request itself is malformed; nothing was read or forwarded."""

    status, code = 400, "bad_hapi_request"


class SwiftDeniedError(HapiResponseError):
    """Swift refused the caller's read of an object.

    The status and code are per instance, Swift's own (401, 403, 404, ...), passed on as they
    are so that a client sees what a plain GET would have answered.
    """

    def __init__(
        self, detail: str, *, status: int, code: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail, status=status, code=code, headers=headers)


class NoHapiServerError(HapiResponseError):
    """No configured HAPI server passed its health check or accepted the request."""

    status, code = 503, "no_hapi_server"


class UpstreamError(HapiResponseError):
    """A HAPI server accepted the connection but failed before answering."""

    status, code = 502, "hapi_server_error"
