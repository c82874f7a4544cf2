"""Reading Swift objects as the caller, through the rest of the proxy pipeline.

``make_subrequest`` copies the caller's identity (``swift.authorize``, ``REMOTE_USER``, the
keystone headers) into the subrequest, so the auth middleware and the container ACLs decide
exactly as they would for the caller's own GET. Nothing here is pre-authorised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

import eventlet
from swift.common.http import is_success
from swift.common.swob import Response
from swift.common.utils import close_if_possible, drain_and_close
from swift.common.wsgi import make_subrequest

from hapi_core.errors import RequestTimeoutError, StorageUnavailableError
from swift_middleware.errors import BadHapiRequestError, SwiftDeniedError

__all__ = ["SWIFT_SOURCE", "Logger", "WsgiApp", "authorize_read", "read_object", "stat_object"]

SWIFT_SOURCE = "HAPI"
"""How the proxy log marks the filter's subrequests."""

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

Logger: TypeAlias = "logging.Logger | logging.LoggerAdapter[logging.Logger]"
"""What the filter logs to: Swift's ``get_logger`` adapter (proxy log routing, transaction
ids) in the proxy; any logger in a unit test."""

_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found"}


def _refusal(resp: Response, what: str) -> SwiftDeniedError:
    status = resp.status_int
    code = _CODES.get(status, "swift_error")
    if status == 401:
        detail = f"Swift refused the token for {what} (401): send a valid X-Auth-Token"
    elif status == 403:
        detail = f"no read access to {what} (Swift says 403)"
    elif status == 404:
        detail = f"{what} not found in Swift (404)"
    else:
        detail = f"Swift answered {status} for a read of {what}"
    headers = {}
    if "Www-Authenticate" in resp.headers:
        headers["Www-Authenticate"] = resp.headers["Www-Authenticate"]
    # Swift's status is passed on as it is, so that clients see the same 401/403/404 as a GET.
    return SwiftDeniedError(detail, status=status, code=code, headers=headers)


def stat_object(env: dict[str, Any], app: WsgiApp, path: str, what: str) -> tuple[str, int | None]:
    """HEAD ``path`` as the caller: ``(etag, size)`` when allowed, else SwiftDeniedError."""
    sub = make_subrequest(env, method="HEAD", path=path, swift_source=SWIFT_SOURCE)
    resp = sub.get_response(app)
    drain_and_close(resp)
    if not is_success(resp.status_int):
        raise _refusal(resp, what)
    size = resp.content_length if isinstance(resp.content_length, int) else None
    return str(resp.headers.get("Etag", "")).strip('"'), size


def authorize_read(env: dict[str, Any], app: WsgiApp, path: str, what: str) -> str:
    """HEAD ``path`` as the caller; its etag when allowed, else SwiftDeniedError."""
    return stat_object(env, app, path, what)[0]


def read_object(
    env: dict[str, Any],
    app: WsgiApp,
    path: str,
    what: str,
    *,
    limit: int,
    deadline: float | None = None,
    tail: int = 0,
) -> tuple[bytearray, str]:
    """GET ``path`` as the caller: ``(body, etag)``; at most ``limit`` bytes or a 413; with
    ``tail``, only the last ``tail`` bytes (a suffix range).

    The body is held once: one buffer that the chunks are appended to, handed over as it is,
    never copied to ``bytes``. It grows with the body rather than being sized from
    Content-Length up front: ``bytearray(n)`` zeroes all of it at once, holding the GIL on the
    hub, and the first touch of each page makes that slow (851 ms for 64 MiB on 2 shared
    cores, a plain GET through the proxy waiting for it); appended to, the pages are touched a
    chunk at a time between two yields. A large buffer grows in place (glibc's ``mremap``
    under :mod:`hapi_core.host_allocator`'s mmap threshold) and its slack is never touched,
    so never resident.

    The read yields to the hub after every chunk: the subrequest's chunks come from the object
    server's sockets without ever blocking when the storage network outpaces the CPU, so
    eventlet would switch to no other green thread (every other request of the proxy) until
    the whole object is in. ``deadline`` (``time.monotonic``) bounds the read: past it, the
    read stops between two chunks with a 504; it is never interrupted inside the pipeline.
    """
    headers = {"Range": f"bytes=-{tail}"} if tail > 0 else None
    sub = make_subrequest(env, method="GET", path=path, headers=headers, swift_source=SWIFT_SOURCE)
    resp = sub.get_response(app)
    if not is_success(resp.status_int):
        drain_and_close(resp)
        raise _refusal(resp, what)
    too_large = BadHapiRequestError(
        f"{what} is over the limit of {limit} bytes", status=413, code="too_large"
    )
    expected = resp.content_length if isinstance(resp.content_length, int) else None
    if expected is not None and expected > limit:
        close_if_possible(resp.app_iter)
        raise too_large
    try:
        buf = _read_body(resp.app_iter, expected, limit, deadline, what, too_large)
    finally:
        close_if_possible(resp.app_iter)
    return buf, str(resp.headers.get("Etag", "")).strip('"')


def _read_body(
    chunks: Iterable[bytes],
    expected: int | None,
    limit: int,
    deadline: float | None,
    what: str,
    too_large: BadHapiRequestError,
) -> bytearray:
    buf = bytearray()
    for chunk in chunks:
        end = len(buf) + len(chunk)
        if end > limit:
            raise too_large
        if expected is not None and end > expected:
            raise StorageUnavailableError(f"Swift sent more of {what} than its Content-Length")
        buf += chunk
        eventlet.sleep(0)
        if deadline is not None and time.monotonic() > deadline:
            raise RequestTimeoutError(f"the read of {what} did not finish within request_timeout")
    if expected is not None and len(buf) != expected:
        raise StorageUnavailableError(
            f"Swift ended {what} after {len(buf)} of its {expected} bytes"
        )
    return buf
