"""Translate python-swiftclient failures into this package's exceptions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from requests.exceptions import RequestException
from swiftclient.client import Connection
from swiftclient.exceptions import ClientException

from .errors import SwiftAuthError, SwiftError, SwiftUnavailableError

__all__ = ["is_not_found", "swift_errors"]

_STACK_HINT = "is the stack up? run `hapi stack up`"


def is_not_found(exc: ClientException) -> bool:
    """True for a 404 from Swift."""
    return exc.http_status == 404


def _reason(exc: BaseException) -> str:
    text = str(exc)
    for marker, reason in (
        ("Connection refused", "connection refused"),
        ("Name or service not known", "unknown host"),
        ("timed out", "timed out"),
        ("Connection reset", "connection reset"),
    ):
        if marker in text:
            return reason
    return text if len(text) <= 200 else text[:200] + "..."


def _endpoint(conn: Connection) -> str:
    """``"storage"`` once the connection holds a storage URL (authenticated), else ``"auth"``."""
    return "storage" if getattr(conn, "url", None) else "auth"


@contextmanager
def swift_errors(conn: Connection, what: str) -> Iterator[None]:
    """Turn swiftclient/requests errors raised inside the block into this package's errors.

    An unreachable Swift is the client's :class:`~hapi_client.errors.SwiftUnavailableError`;
    every other failure a :class:`SwiftError`.

    ``what`` names the operation (``"PUT demo/shards/shard-000000.tar"``) in the message.
    Callers that expect a 404 catch ``ClientException`` inside the block themselves.
    """
    try:
        yield
    except ClientException as exc:
        status = exc.http_status
        if status == 401:
            raise SwiftAuthError(
                f"{what}: Swift at {conn.authurl} rejected the credentials of user "
                f"{conn.user!r} (401 Unauthorized)"
            ) from exc
        if status == 403:
            raise SwiftAuthError(
                f"{what}: user {conn.user!r} may not do this (403 Forbidden)"
            ) from exc
        if status is None:
            raise SwiftUnavailableError(
                f"{what}: no answer from Swift at {conn.authurl}: {_reason(exc)}; {_STACK_HINT}",
                endpoint=_endpoint(conn),
                status=None,
            ) from exc
        raise SwiftError(
            f"{what}: Swift answered {status} {exc.http_reason or ''}".rstrip()
        ) from exc
    except (OSError, RequestException) as exc:
        raise SwiftUnavailableError(
            f"{what}: cannot reach Swift at {conn.authurl}: {_reason(exc)}; {_STACK_HINT}",
            endpoint=_endpoint(conn),
            status=None,
        ) from exc
