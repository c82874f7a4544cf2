"""The caller's Swift session: credentials, token, storage URL, timed object reads.

Reads and logins that fail for a reason that can pass (no answer, a 5xx: a restarting proxy,
object server or memcached) are retried on the client's time budget (:mod:`hapi_client.retry`);
refusals (401, 403, 404) are final at once.

Logins are single-flight: one thread logs in while the others that need a token wait for its
outcome (token or error), bounded by the budget plus one attempt's timeout. No lock is held
across the retries, so a thread that still has a valid token is never held up by a login, and
every thread that needed the failed login gets its error when the budget is spent, not one
budget after another. The login has an outage of its own, ended only by a successful login: a
read or an extraction that succeeds meanwhile does not restart the login's budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import TypeVar

import urllib3
from swiftclient.client import ClientException, Connection

from .bandwidth import BandwidthEstimator, StreamClock
from .defaults import DEFAULT_AUTH_URL
from .errors import SwiftAccessError, SwiftUnavailableError
from .retry import Outage, RetryClock, RetryPolicy, failure_kind
from .throttle import TokenBucket

log = logging.getLogger(__name__)
status = logging.getLogger("hapi_client.status")

#: Longest a bandwidth probe reads (it stops earlier at its byte count).
PROBE_SECONDS = 2.0
#: A probe's first ranged read; each next one is twice as large (see ``read_prefix``).
PROBE_FIRST_BYTES = 64 << 10
#: Socket timeout of one Swift request (swiftclient's ``timeout``): the most one attempt takes.
ATTEMPT_TIMEOUT_S = 60.0

_T = TypeVar("_T")


@dataclass(frozen=True)
class SwiftCredentials:
    """tempauth / v1 credentials (``ST_AUTH``, ``ST_USER``, ``ST_KEY``)."""

    auth_url: str = DEFAULT_AUTH_URL
    user: str = "test:tester"
    key: str = "testing"

    def connection(self, *, retries: int = 2) -> Connection:
        """A swiftclient connection; ``retries`` are swiftclient's own (count-based) retries."""
        return Connection(
            authurl=self.auth_url,
            user=self.user,
            key=self.key,
            retries=retries,
            timeout=ATTEMPT_TIMEOUT_S,
        )


def _status(exc: BaseException) -> int | None:
    return exc.http_status if isinstance(exc, ClientException) else None


class _TruncatedBody(Exception):
    """An object body ended before its Content-Length (the proxy went away mid-transfer)."""


def is_transient(exc: Exception) -> bool:
    """True for a failure that can pass with time: no answer at all, a cut transfer, a 5xx."""
    if isinstance(exc, ClientException):
        return exc.http_status is None or exc.http_status >= 500
    # requests' errors are OSErrors; a body cut mid-read surfaces from urllib3 or http.client.
    return isinstance(exc, OSError | HTTPException | urllib3.exceptions.HTTPError | _TruncatedBody)


def _describe(
    exc: Exception, what: str, creds: SwiftCredentials, clock: RetryClock | None = None
) -> SwiftAccessError:
    status = _status(exc)
    if status == 401:
        return SwiftAccessError(
            f"Swift rejected the credentials of {creds.user} at {creds.auth_url} (401)"
        )
    if status == 403:
        return SwiftAccessError(f"{creds.user} may not read {what} (Swift says 403)")
    if status == 404:
        return SwiftAccessError(f"{what} does not exist in Swift (404)")
    if status is not None and status < 500:
        return SwiftAccessError(f"Swift answered {status} for {what}: {getattr(exc, 'msg', exc)}")
    tried = f" ({clock.summary()})" if clock is not None else ""
    endpoint = "auth" if what == _AUTH else "storage"
    if status is None:
        kind = failure_kind(exc)
        if kind == "refused":
            cause = f"nothing listens at {creds.auth_url}: is the stack up? run `hapi stack up`"
        elif kind == "cut":
            cause = (
                "the connection was cut mid-transfer (a proxy or storage server restarted?); "
                "if it keeps happening, see the Swift logs"
            )
        elif kind == "timeout":
            cause = "Swift did not answer in time: is the proxy overloaded or hung?"
        else:
            cause = f"{short_reason(exc)}; is the stack up? run `hapi stack up`"
        message = f"cannot read {what} from Swift at {creds.auth_url}{tried}: {cause}"
    elif endpoint == "auth" and status == 503:
        # tempauth answers 503 exactly when it cannot store a new token in memcached.
        message = (
            f"Swift auth at {creds.auth_url} answered 503{tried}: the proxy's memcached "
            "(tempauth's token store) is likely down; run `hapi stack up`"
        )
    elif status == 503:
        message = (
            f"Swift answered 503 for {what}{tried}: no storage node answered (an object, "
            "container or account server is likely down); run `hapi stack up`"
        )
    else:
        message = (
            f"Swift answered {status} for {what}{tried}: {getattr(exc, 'msg', exc)}; the "
            "server answered 5xx: see the Swift logs"
        )
    return SwiftUnavailableError(message, endpoint=endpoint, status=status)


_AUTH = "the auth endpoint"


def _fresh(exc: Exception) -> Exception:
    """A copy of ``exc`` with the same type, message and attributes (and no traceback)."""
    new = type(exc).__new__(type(exc), *exc.args)
    new.args = exc.args
    new.__dict__.update(exc.__dict__)
    return new


@dataclass
class _Login:
    """One login in flight: its outcome, for the threads that wait on it."""

    done: threading.Event = field(default_factory=threading.Event)
    result: tuple[str, str] | None = None
    error: BaseException | None = None


def short_reason(exc: BaseException) -> str:
    """One line for a failed attempt: the kind of failure where it is known, else the
    exception's own (shortened) text, never urllib3's nested reprs."""
    kind = failure_kind(exc)
    if kind == "refused":
        return "connection refused"
    if kind == "timeout":
        return "timed out"
    if kind == "cut":
        return "connection cut mid-transfer"
    status = _status(exc)
    if status is not None:
        return f"{status} {getattr(exc, 'http_reason', '') or ''}".rstrip()
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 160 else text[:160] + "..."


class SwiftSession:
    """One authenticated Swift session; thread-safe (a connection per thread).

    ``retry`` sets how long reads and logins keep being retried after a failure that can pass
    (default :class:`~hapi_client.retry.RetryPolicy`, whose budget outlasts a service restart).
    """

    def __init__(
        self,
        credentials: SwiftCredentials,
        bandwidth: BandwidthEstimator | None = None,
        throttle: TokenBucket | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.credentials = credentials
        self.bandwidth = bandwidth
        self.throttle = throttle
        self.retry = retry or RetryPolicy()
        self._local = threading.local()
        # Guards the token and the login in flight; never held across a request.
        self._auth_lock = threading.Lock()
        self._login: _Login | None = None
        self._storage_url: str | None = None
        self._token: str | None = None
        #: Swift's current outage for object reads, shared by every read of this session.
        self.outage = Outage()
        #: The auth endpoint's current outage: only a successful login ends it.
        self.auth_outage = Outage()

    def _conn(self) -> Connection:
        # No retries of swiftclient's own: this session retries on its time budget instead.
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.credentials.connection(retries=0)
            self._local.conn = conn
        return conn

    def _retrying(
        self, what: str, attempt: Callable[[], _T], clock: RetryClock | None = None
    ) -> _T:
        """``attempt()`` until it succeeds, a final error, or the retry budget is spent."""
        clock = clock or self.retry.clock(f"Swift request for {what}", self.outage)
        while True:
            clock.attempt()
            try:
                result = attempt()
            except Exception as exc:  # swiftclient raises ClientException and socket errors
                if not is_transient(exc) or not clock.wait(short_reason(exc)):
                    raise _describe(exc, what, self.credentials, clock) from exc
            else:
                clock.succeeded()
                return result

    def auth(
        self,
        *,
        refresh: bool = False,
        stale_token: str | None = None,
        clock: RetryClock | None = None,
    ) -> tuple[str, str]:
        """(storage URL, token), authenticating once and again when ``refresh``.

        ``stale_token``: refresh only if the current token is still that one (another thread
        may have refreshed it meanwhile). ``clock``: the retry clock of the request this login
        serves: the login gives up when that request's budget or the auth endpoint's outage
        budget is spent, whichever comes first. A login already in flight is joined, not
        repeated (see the module docstring).
        """
        with self._auth_lock:
            needed = refresh and (stale_token is None or stale_token == self._token)
            if not needed and self._token is not None:
                assert self._storage_url is not None
                return self._storage_url, self._token
            login, leader = self._login, self._login is None
            if login is None:
                login = self._login = _Login()
        if leader:
            return self._log_in(login, clock)
        return self._join(login)

    def _log_in(self, login: _Login, clock: RetryClock | None) -> tuple[str, str]:
        """Log in (retrying on the auth outage's budget) and hand the outcome to the waiters."""
        auth_clock = self.retry.clock("Swift login", self.auth_outage, parent=clock)
        try:
            url, token = self._retrying(_AUTH, lambda: self._conn().get_auth(), auth_clock)
        except BaseException as exc:
            login.error = exc
            raise
        else:
            login.result = (url, token)
            return url, token
        finally:
            with self._auth_lock:
                if login.result is not None:
                    self._storage_url, self._token = login.result
                self._login = None
            login.done.set()

    def _join(self, login: _Login) -> tuple[str, str]:
        """Wait for another thread's login; its token, or its error raised here too."""
        # The leader gives up within the budget plus one attempt; wait that long from now.
        if not login.done.wait(self.retry.budget_s + ATTEMPT_TIMEOUT_S):
            raise SwiftUnavailableError(
                f"the login to Swift at {self.credentials.auth_url} in another thread did not "
                f"finish within {self.retry.budget_s + ATTEMPT_TIMEOUT_S:g} s",
                endpoint="auth",
                status=None,
            )
        if login.error is not None:
            if isinstance(login.error, Exception):
                # A copy: one exception object raised in several threads mixes their tracebacks.
                raise _fresh(login.error) from login.error
            raise SwiftUnavailableError(
                f"the login to Swift at {self.credentials.auth_url} was interrupted "
                f"in another thread ({type(login.error).__name__})",
                endpoint="auth",
                status=None,
            )
        assert login.result is not None
        return login.result

    def get(self, container: str, name: str, *, observe: bool = True) -> tuple[bytes, str]:
        """Read an object whole; its transfer feeds the bandwidth estimate."""
        what = f"{container}/{name}"

        def read() -> tuple[dict[str, str], list[bytes], float | None]:
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
            expected = headers.get("content-length", "")
            got = sum(len(c) for c in chunks)
            if expected.isdigit() and got != int(expected):
                raise _TruncatedBody(f"{what}: got {got} of {expected} bytes")
            return headers, chunks, first

        headers, chunks, first = self._retrying(what, read)
        data = b"".join(chunks)
        if observe and self.bandwidth is not None and first is not None and len(chunks) > 1:
            self.bandwidth.observe(len(data) - len(chunks[0]), time.perf_counter() - first)
        return data, headers.get("etag", "").strip('"')

    def _read_range(
        self, container: str, name: str, offset: int, nbytes: int, into: list[bytes]
    ) -> tuple[int, StreamClock]:
        """Bytes ``[offset, offset + nbytes)`` of an object appended to ``into``, read whole and
        timed chunk by chunk; the count read (short at the object's end, 0 past it)."""
        headers = {"Range": f"bytes={offset}-{offset + nbytes - 1}"}
        clock = StreamClock()
        try:
            _, body = self._conn().get_object(
                container, name, headers=headers, resp_chunk_size=1 << 16
            )
        except ClientException as exc:
            if exc.http_status == 416 and offset > 0:
                return 0, clock  # the object ended exactly where the last range did
            raise
        got = 0
        try:
            for chunk in body:
                if self.throttle is not None:
                    self.throttle.consume(len(chunk))
                clock.chunk(len(chunk))
                into.append(chunk)
                got += len(chunk)
        finally:
            body.close()
        return got, clock

    def probe(self, container: str, name: str, nbytes: int = 8 << 20) -> float:
        """Time a ranged read of up to ``nbytes`` of an object; return bytes/s and feed the estimate."""
        return self.read_prefix(container, name, nbytes)[0]

    def read_prefix(
        self, container: str, name: str, nbytes: int, *, max_seconds: float = PROBE_SECONDS
    ) -> tuple[float, bytes]:
        """A timed ranged read of an object's first ``nbytes``: the rate (fed to the bandwidth
        estimate) and the bytes.

        The prefix is read in ranged reads of doubling size, ``PROBE_FIRST_BYTES`` first, each
        read whole, and none starts after ``max_seconds``: on a slow link a few seconds of
        transfer time the rate as well as megabytes do, and a whole shard at 2 Mbit/s would take
        20 s. One read of all ``nbytes`` stopped early was tried first: the rest of its range
        was already on its way, queued at the link and in the sockets, and the plan's next
        request waited behind it (an 8 MiB probe stopped after half a second at 5 Mbit/s held
        the next GET back by 0.6 s). The rate is timed as the epoch's streams are
        (:class:`StreamClock`), each read from its first chunk on: the request's latency and a
        shaper's burst, which arrive before it, read a 6.4 Mbit/s htb link as 7.8 over half a
        second. A probe whose reads are one chunk each is timed whole.
        """
        what = f"{container}/{name}"

        def read() -> tuple[bytes, float, int, float]:
            start = time.perf_counter()
            chunks: list[bytes] = []
            offset, size = 0, PROBE_FIRST_BYTES
            carried, carried_s = 0, 0.0
            while offset < nbytes:
                want = min(size, nbytes - offset)
                got, clock = self._read_range(container, name, offset, want, chunks)
                busy, busy_s = clock.carried()
                carried, carried_s = carried + busy, carried_s + busy_s
                offset += got
                elapsed = time.perf_counter() - start
                if got < want or elapsed >= max_seconds:
                    break  # the object ended, or the time is up
                # Twice as much, but no more than the rate so far carries in the time left.
                rate = carried / carried_s if carried_s > 0 else offset / max(elapsed, 1e-9)
                size = min(2 * size, max(PROBE_FIRST_BYTES, int(rate * (max_seconds - elapsed))))
            return b"".join(chunks), time.perf_counter() - start, carried, carried_s

        data, seconds, carried, carried_s = self._retrying(what, read)
        if carried > 0 and carried_s > 0:
            seconds = carried_s
        else:
            carried = len(data)
        rate = carried / max(seconds, 1e-9)
        if self.bandwidth is not None:
            self.bandwidth.observe(carried, seconds)
        status.info(
            "bandwidth probe: %d bytes of %s, %d timed in %.2f s = %.1f Mbit/s",
            len(data),
            what,
            carried,
            seconds,
            rate * 8e-6,
        )
        return rate, data

    def connection(self) -> Connection:
        """This thread's swiftclient connection for metadata operations (listings, manifests).

        It keeps swiftclient's own few retries; object reads and logins go through
        :meth:`get` and :meth:`auth`, which retry on the time budget.
        """
        conn = getattr(self._local, "meta_conn", None)
        if conn is None:
            conn = self.credentials.connection()
            self._local.meta_conn = conn
        return conn
