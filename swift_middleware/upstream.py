"""The configured HAPI servers: round-robin choice, cached health checks, streamed forwarding.

The proxy runs under eventlet with the socket module monkey-patched, so the standard
``http.client`` used here is green there: a request waiting on a HAPI server yields to the
proxy's other requests (Swift's own ``bufferedhttp`` relies on the same patching).
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from hapi_contract import EXTRACT_PATH, HEALTH_PATH
from swift_middleware.errors import NoHapiServerError, UpstreamError
from swift_middleware.swift_access import Logger

__all__ = ["HapiServer", "ServerPool", "StreamedBody", "UpstreamResponse", "forward"]

_default_logger = logging.getLogger(__name__)

CHUNK_SIZE = 64 * 1024
# What of a HAPI server's answer reaches the Swift client; hop-by-hop and server-identifying
# headers stay behind (the proxy frames the body itself).
_PASSED_HEADERS = ("content-type", "retry-after", "www-authenticate")


def _connection(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    assert parts.hostname is not None  # checked by FilterConfig
    return cls(parts.hostname, parts.port, timeout=timeout)


@dataclass
class HapiServer:
    """One HAPI server and what its last health check said."""

    url: str
    healthy: bool | None = None
    checked_at: float = field(default=float("-inf"))
    reason: str = "not checked yet"


def probe_health(url: str, timeout: float) -> str | None:
    """None if ``GET url/healthz`` answers 200 within ``timeout``, else why not."""
    conn = _connection(url, timeout)
    try:
        conn.request("GET", HEALTH_PATH, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        resp.read(64 * 1024)
        if resp.status != 200:
            return f"{HEALTH_PATH} answered {resp.status}"
        return None
    except (OSError, http.client.HTTPException) as exc:
        return f"{HEALTH_PATH} failed: {exc or type(exc).__name__}"
    finally:
        conn.close()


class ServerPool:
    """Round-robin over HAPI servers, skipping those whose health check failed recently.

    A server's health is re-checked when its last check is older than ``interval`` seconds
    (0: before every request). :meth:`mark_down` records a failure seen while forwarding.
    """

    def __init__(
        self,
        urls: list[str],
        *,
        interval: float,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
        probe: Callable[[str, float], str | None] = probe_health,
        logger: Logger = _default_logger,
    ) -> None:
        if not urls:
            raise ValueError("a ServerPool needs at least one server")
        self.servers = [HapiServer(url) for url in urls]
        self._interval = interval
        self._timeout = timeout
        self._clock = clock
        self._probe = probe
        self.logger = logger
        self._next = 0
        self._lock = threading.Lock()

    def _rotation(self) -> list[int]:
        with self._lock:
            start = self._next
        n = len(self.servers)
        return [(start + i) % n for i in range(n)]

    def _check(self, server: HapiServer) -> None:
        now = self._clock()
        if server.healthy is not None and now - server.checked_at < self._interval:
            return
        reason = self._probe(server.url, self._timeout)
        server.healthy, server.checked_at = reason is None, self._clock()
        server.reason = reason or "healthy"
        if reason is not None:
            self.logger.warning("HAPI server %s is down: %s", server.url, reason)

    def candidates(self) -> Iterator[HapiServer]:
        """Healthy servers, the round-robin one first; checks health lazily as it goes."""
        for index in self._rotation():
            server = self.servers[index]
            self._check(server)
            if server.healthy:
                # The next request starts after this one, so the server that follows a sick
                # one does not get the sick one's share as well.
                with self._lock:
                    self._next = (index + 1) % len(self.servers)
                yield server

    def mark_down(self, server: HapiServer, reason: str) -> None:
        """Take ``server`` out of the rotation until its next health check."""
        server.healthy, server.checked_at, server.reason = False, self._clock(), reason
        self.logger.warning("HAPI server %s failed: %s", server.url, reason)

    def unavailable(self, retry_after: int) -> NoHapiServerError:
        """The 503 to answer when no server could take a request."""
        reasons = "; ".join(f"{s.url}: {s.reason}" for s in self.servers)
        return NoHapiServerError(
            f"no HAPI server is available ({reasons}); try again later",
            headers={"Retry-After": str(retry_after)},
        )


class StreamedBody:
    """A HAPI server's response body as a WSGI iterable: chunks as they arrive, then close.

    A failure mid-stream ends the body early; the client notices because the frame stream then
    lacks its end frame.
    """

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        logger: Logger = _default_logger,
    ) -> None:
        self._conn = conn
        self._resp = resp
        self._logger = logger
        self.bytes_sent = 0

    def __iter__(self) -> Iterator[bytes]:
        try:
            while True:
                data = self._resp.read1(CHUNK_SIZE)
                if not data:
                    return
                self.bytes_sent += len(data)
                yield data
        except (OSError, http.client.HTTPException) as exc:
            self._logger.warning("HAPI stream cut after %d bytes: %r", self.bytes_sent, exc)
        finally:
            self.close()

    def close(self) -> None:
        # Closing the socket is how the HAPI server learns that the client went away.
        self._resp.close()
        self._conn.close()


@dataclass
class UpstreamResponse:
    """What a HAPI server answered: status line, the headers to pass on, the streamed body."""

    server: str
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: StreamedBody


def _open(server: HapiServer, conn_timeout: float) -> http.client.HTTPConnection:
    conn = _connection(server.url, conn_timeout)
    conn.connect()
    return conn


def forward(
    pool: ServerPool,
    body: bytes,
    headers: dict[str, str],
    *,
    conn_timeout: float,
    node_timeout: float,
    retry_after: int,
    path: str = EXTRACT_PATH,
) -> UpstreamResponse:
    """POST ``body`` to ``path`` of the next healthy HAPI server and return its answer.

    A server that refuses the connection is marked down and the next one is tried (nothing has
    run there yet); NoHapiServerError when none is left. Once the request went out, a failure
    is an UpstreamError (502): it is not retried, since the server may be running it.
    """
    for server in pool.candidates():
        try:
            conn = _open(server, conn_timeout)
        except OSError as exc:
            pool.mark_down(server, f"connect failed: {exc or type(exc).__name__}")
            continue
        try:
            assert conn.sock is not None
            conn.sock.settimeout(node_timeout)
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            pool.mark_down(server, f"request failed: {exc or type(exc).__name__}")
            raise UpstreamError(
                f"the HAPI server failed before answering ({type(exc).__name__}: {exc})"
            ) from exc
        passed = [(k, v) for k, v in resp.getheaders() if _passes(k, resp)]
        return UpstreamResponse(
            server.url, resp.status, resp.reason, passed, StreamedBody(conn, resp, pool.logger)
        )
    raise pool.unavailable(retry_after)


def _passes(name: str, resp: http.client.HTTPResponse) -> bool:
    lower = name.lower()
    if lower == "content-length":
        return not resp.chunked
    return lower in _PASSED_HEADERS or lower.startswith("x-hapi-")
