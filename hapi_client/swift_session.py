"""The caller's Swift session: credentials, token, storage URL, timed object reads."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from swiftclient.client import ClientException, Connection

from .bandwidth import BandwidthEstimator
from .errors import SwiftAccessError
from .throttle import TokenBucket

log = logging.getLogger(__name__)

DEFAULT_AUTH_URL = "http://127.0.0.1:8080/auth/v1.0"


@dataclass(frozen=True)
class SwiftCredentials:
    """tempauth / v1 credentials (``ST_AUTH``, ``ST_USER``, ``ST_KEY``)."""

    auth_url: str = DEFAULT_AUTH_URL
    user: str = "test:tester"
    key: str = "testing"

    def connection(self) -> Connection:
        return Connection(
            authurl=self.auth_url, user=self.user, key=self.key, retries=2, timeout=60
        )


def _describe(exc: Exception, what: str, creds: SwiftCredentials) -> SwiftAccessError:
    if isinstance(exc, ClientException):
        status = exc.http_status
        if status == 401:
            return SwiftAccessError(
                f"Swift rejected the credentials of {creds.user} at {creds.auth_url} (401)"
            )
        if status == 403:
            return SwiftAccessError(f"{creds.user} may not read {what} (Swift says 403)")
        if status == 404:
            return SwiftAccessError(f"{what} does not exist in Swift (404)")
        if status is None:
            return SwiftAccessError(
                f"cannot reach Swift at {creds.auth_url} ({exc.msg}); is the stack up? run `hapi stack up`"
            )
        return SwiftAccessError(f"Swift answered {status} for {what}: {exc.msg}")
    return SwiftAccessError(
        f"cannot reach Swift at {creds.auth_url} ({exc}); is the stack up? run `hapi stack up`"
    )


class SwiftSession:
    """One authenticated Swift session; thread-safe (a connection per thread)."""

    def __init__(
        self,
        credentials: SwiftCredentials,
        bandwidth: BandwidthEstimator | None = None,
        throttle: TokenBucket | None = None,
    ) -> None:
        self.credentials = credentials
        self.bandwidth = bandwidth
        self.throttle = throttle
        self._local = threading.local()
        self._auth_lock = threading.Lock()
        self._storage_url: str | None = None
        self._token: str | None = None

    def _conn(self) -> Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.credentials.connection()
            self._local.conn = conn
        return conn

    def auth(self, *, refresh: bool = False) -> tuple[str, str]:
        """(storage URL, token), authenticating once and again when ``refresh``."""
        with self._auth_lock:
            if refresh or self._token is None:
                try:
                    url, token = self._conn().get_auth()
                except Exception as exc:  # swiftclient raises ClientException and socket errors
                    raise _describe(exc, "the auth endpoint", self.credentials) from exc
                self._storage_url, self._token = url, token
            assert self._storage_url is not None and self._token is not None
            return self._storage_url, self._token

    def get(self, container: str, name: str, *, observe: bool = True) -> tuple[bytes, str]:
        """Read an object whole; its transfer feeds the bandwidth estimate."""
        what = f"{container}/{name}"
        try:
            # Timed from the end of the first chunk to the last byte, over the bytes after the
            # first chunk: the request's latency and the server's time to first byte are not
            # the link's bandwidth. Small chunks keep that first chunk small.
            headers, body = self._conn().get_object(container, name, resp_chunk_size=64 * 1024)
            chunks = []
            first: float | None = None
            for chunk in body:
                if self.throttle is not None:
                    self.throttle.consume(len(chunk))
                chunks.append(chunk)
                if first is None:
                    first = time.perf_counter()
            data = b"".join(chunks)
        except Exception as exc:
            raise _describe(exc, what, self.credentials) from exc
        if observe and self.bandwidth is not None and first is not None and len(chunks) > 1:
            self.bandwidth.observe(len(data) - len(chunks[0]), time.perf_counter() - first)
        return data, headers.get("etag", "").strip('"')

    def probe(self, container: str, name: str, nbytes: int = 8 << 20) -> float:
        """Time a ranged read of up to ``nbytes`` of an object; return bytes/s and feed the estimate."""
        what = f"{container}/{name}"
        try:
            start = time.perf_counter()
            _, body = self._conn().get_object(
                container, name, headers={"Range": f"bytes=0-{nbytes - 1}"}, resp_chunk_size=1 << 20
            )
            total = 0
            for chunk in body:
                if self.throttle is not None:
                    self.throttle.consume(len(chunk))
                total += len(chunk)
            seconds = time.perf_counter() - start
        except Exception as exc:
            raise _describe(exc, what, self.credentials) from exc
        rate = total / max(seconds, 1e-9)
        if self.bandwidth is not None:
            self.bandwidth.observe(total, seconds)
        log.info(
            "bandwidth probe: %d bytes of %s in %.3f s = %.1f Mbit/s",
            total,
            what,
            seconds,
            rate * 8e-6,
        )
        return rate

    def connection(self) -> Connection:
        """This thread's swiftclient connection (for metadata operations)."""
        return self._conn()
