"""Retrying on a time budget: how long the client keeps trying after something failed.

A request that fails for a reason that can pass (a connection refused or cut, a 5xx, a stream
that broke off, Swift's auth answering 503) is tried again with jittered exponential back-off until
``budget_s`` seconds have passed since its *first* failure; the last attempt starts no later than
that. A count of attempts would not do: how long a restart takes, not how often one retries during
it, decides whether a request survives it.

The default, :data:`DEFAULT_RETRY_BUDGET_S`, outlasts a restart of any one service of the local
stack with ``hapi stack up`` (measured on a 2-core machine: 8 to 16 s from the command to a healthy
stack, the HAPI server being the slowest) several times over, leaving an operator time to type the
command. Set it per client: ``HapiClient(..., retry_budget_s=30)`` or ``RetryPolicy(budget_s=30)``;
``hapi finetune --retry-budget 30`` on the command line.

The budget is one service's, not one request's: requests to the same service (the HAPI server, or
Swift) share an :class:`Outage`, which starts at the first failure after a success and ends at
the next success. A request whose first failure falls inside an ongoing outage gets only what is
left of that outage's budget, so a run whose prefetch keeps several requests in flight (or
starts new ones while an outage lasts) still gives up ``budget_s`` after the outage began, plus at
most the time of the one attempt in progress. Only a success of an attempt that *started* after
the outage began ends it: a long stream that was already under way when the service failed, and
completes, says nothing about whether the service answers now. A step that serves a request
(the login before an extraction) runs on a clock of its own outage whose ``parent`` is the
request's clock: it gives up when either budget is spent, so nesting never adds budgets. The first
failure of an outage is logged as one warning line; every further retry at debug level.

Time comes from ``RetryPolicy.clock_fn`` and ``RetryPolicy.sleep_fn`` (``time.monotonic`` and
``time.sleep`` unless given), so the arithmetic can be checked with a fake clock.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_RETRY_BUDGET_S",
    "Outage",
    "RetryClock",
    "RetryEvent",
    "RetryPolicy",
    "failure_kind",
]

log = logging.getLogger(__name__)

#: Seconds a request keeps being retried after its first failure (see the module docstring).
DEFAULT_RETRY_BUDGET_S = 120.0


@dataclass(frozen=True)
class RetryEvent:
    """One failed attempt that will be retried, as passed to ``RetryPolicy.on_retry``."""

    what: str
    """What was tried, e.g. ``extracting photos-train/shard-000003.tar``."""
    reason: str
    """Why the attempt failed."""
    failures: int
    """Failed attempts of this request so far."""
    elapsed_s: float
    """Seconds since the request's first failure."""
    pause_s: float
    """Seconds until the next attempt."""


@dataclass(frozen=True)
class RetryPolicy:
    """Retry for ``budget_s`` seconds after a request's first failure, backing off exponentially.

    The pause before retry ``k`` (0-based) is ``backoff_s * 2**k`` with +-25 % jitter (so
    parallel requests do not retry in lockstep), at most ``max_backoff_s``, or the server's
    ``Retry-After`` if it sent one, never past the end of the budget. ``attempts`` optionally
    caps the number of attempts as well (None: only the budget counts). ``on_retry`` is called
    (from the thread that retries) before each pause, e.g. to show that a run waits for a
    service.
    """

    budget_s: float = DEFAULT_RETRY_BUDGET_S
    backoff_s: float = 0.25
    max_backoff_s: float = 4.0
    attempts: int | None = None
    on_retry: Callable[[RetryEvent], None] | None = field(default=None, compare=False)
    clock_fn: Callable[[], float] | None = field(default=None, compare=False)
    """Monotonic seconds (None: ``time.monotonic``); a fake one makes the budget testable."""
    sleep_fn: Callable[[float], None] | None = field(default=None, compare=False)
    """Pauses between attempts (None: ``time.sleep``)."""

    def __post_init__(self) -> None:
        if self.budget_s < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("retry budget and back-off must be >= 0 seconds")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("attempts must be >= 1 (or None for no cap)")

    def delay(self, retry: int, retry_after: str | None = None) -> float:
        """The pause before retry number ``retry`` (0-based)."""
        if retry_after and retry_after.isdigit():
            return min(float(retry_after), self.max_backoff_s)
        jitter = 0.75 + random.random() / 2  # noqa: S311 - spreads retries, not security
        return min(self.max_backoff_s, self.backoff_s * 2**retry * jitter)

    def now(self) -> float:
        """The policy's monotonic time in seconds."""
        return (self.clock_fn or time.monotonic)()

    def pause(self, seconds: float) -> None:
        (self.sleep_fn or time.sleep)(seconds)  # back-off between attempts, not synchronisation

    def clock(
        self, what: str, outage: Outage | None = None, *, parent: RetryClock | None = None
    ) -> RetryClock:
        """A fresh clock for one request (``what`` names it in logs and events); ``outage``:
        the service's shared outage, whose start the request's budget counts from; ``parent``:
        the clock of the request this one serves (its budget bounds this one's too)."""
        return RetryClock(self, what, outage, parent)


class Outage:
    """When the current outage of one service began: its first failure since its last success.

    Shared by every request to that service (thread-safe). :meth:`began` is called at a
    request's first failure and answers the outage's start (that failure's time when none was
    going on) and whether this failure opened it; :meth:`failed` at every failure (the count the
    final error states); :meth:`ended` at a success, which ends the outage only if its attempt
    started after the outage began.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    def began(self, now: float) -> tuple[float, bool]:
        with self._lock:
            if self._since is None:
                self._since, self._failures = now, 0
                return now, True
            return self._since, False

    def failed(self) -> int:
        """Count one failed attempt of any request; the outage's failures so far."""
        with self._lock:
            self._failures += 1
            return self._failures

    def ended(self, attempt_started: float | None = None) -> None:
        """A request went through. ``attempt_started``: when its successful attempt began;
        one that began before the outage (None: unknown, taken as after) does not end it."""
        with self._lock:
            if self._since is not None and attempt_started is not None:
                if attempt_started < self._since:
                    return
            self._since = None

    @property
    def failures(self) -> int:
        """Failed attempts of every request since the outage began (0 while none is going on)."""
        return self._failures if self._since is not None else 0

    @property
    def since(self) -> float | None:
        """``time.monotonic()`` of the outage's first failure; None while none is going on."""
        return self._since


def failure_kind(exc: BaseException) -> str:
    """What a failed attempt saw, from the exception (its chain included): ``"refused"``
    (nothing listens), ``"timeout"``, ``"cut"`` (the connection closed mid-response) or
    ``"other"``. Read from types first, then from the texts urllib3/requests wrap them in."""
    seen: set[int] = set()
    current: BaseException | None = exc
    texts = []
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError):
            return "refused"
        if isinstance(current, TimeoutError):
            return "timeout"
        if isinstance(current, ConnectionResetError | BrokenPipeError):
            return "cut"
        texts.append(f"{type(current).__name__} {current}")
        current = current.__cause__ or current.__context__
    text = " ".join(texts)
    for markers, kind in (
        (("Connection refused", "Errno 111"), "refused"),
        (("timed out", "Timeout"), "timeout"),
        (
            (
                "RemoteProtocolError",
                "IncompleteRead",
                "Connection reset",
                "ProtocolError",
                "ReadError",
                "ChunkedEncodingError",
                "peer closed",
                "_TruncatedBody",
            ),
            "cut",
        ),
    ):
        if any(m in text for m in markers):
            return kind
    return "other"


class RetryClock:
    """The retries of one request: its budget starts at its first failure (or at its outage's).

    Call :meth:`failed` after each failed attempt: it returns the pause before the next attempt,
    or None when the budget (or the attempt cap) is spent and the caller must raise. With a
    ``parent`` (the clock of the request this one serves), the budget counts from the earlier
    of the two starts.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        what: str,
        outage: Outage | None = None,
        parent: RetryClock | None = None,
    ) -> None:
        self.policy = policy
        self.what = what
        self.outage = outage
        self.parent = parent
        self.failures = 0
        self._first_failure: float | None = None
        self._opened = False  # this request's failure began the outage (or it has no outage)
        self._outage_failures = 0
        self._attempt_started: float | None = None

    @property
    def started(self) -> float | None:
        """When this request's budget began counting (None before any failure)."""
        starts = [self._first_failure]
        if self.parent is not None:
            starts.append(self.parent.started)
        known = [s for s in starts if s is not None]
        return min(known) if known else None

    @property
    def elapsed_s(self) -> float:
        """Seconds since the budget began counting (0 before any failure)."""
        started = self.started
        return 0.0 if started is None else self.policy.now() - started

    def attempt(self) -> None:
        """Mark the start of an attempt (so that its success ends only a later outage)."""
        self._attempt_started = self.policy.now()

    def failed(self, retry_after: str | None = None) -> float | None:
        """Count a failure; the pause before the next attempt, or None to give up."""
        now = self.policy.now()
        if self._first_failure is None:
            if self.outage is None:
                self._first_failure, self._opened = now, True
            else:
                self._first_failure, self._opened = self.outage.began(now)
        self.failures += 1
        if self.outage is not None:
            self._outage_failures = self.outage.failed()
        cap = self.policy.attempts
        started = self.started
        assert started is not None
        remaining = self.policy.budget_s - (now - started)
        if (cap is not None and self.failures >= cap) or remaining <= 0:
            return None
        return min(self.policy.delay(self.failures - 1, retry_after), remaining)

    def succeeded(self) -> None:
        """The request went through: its service's outage (if one was going on) is over,
        unless its successful attempt (see :meth:`attempt`) started before the outage did."""
        if self.outage is not None:
            self.outage.ended(self._attempt_started)

    def wait(self, reason: str, retry_after: str | None = None) -> bool:
        """Count a failure and sleep until the next attempt; False to give up instead."""
        pause = self.failed(retry_after)
        if pause is None:
            return False
        if self._opened and self.failures == 1:
            # One line per outage: the later retries (and the other requests') at debug level.
            log.warning(
                "%s failed: %s; retrying for up to %g s",
                self.what,
                reason,
                self.policy.budget_s,
            )
        else:
            log.debug(
                "%s failed (%s), retrying in %.1f s: %s", self.what, self.summary(), pause, reason
            )
        if self.policy.on_retry is not None:
            self.policy.on_retry(
                RetryEvent(self.what, reason, self.failures, self.elapsed_s, pause)
            )
        self.policy.pause(pause)
        return True

    def summary(self) -> str:
        """E.g. ``3 attempts over 12.4 s`` (``3 attempts, 35 in all since the outage began,
        over 120.3 s`` when other requests failed during the same outage), for the final error
        message: the time is since the outage (or the request served) began, as the user saw it."""
        text = f"{self.failures} attempt{'s' * (self.failures != 1)}"
        if self._outage_failures > self.failures:
            text += f", {self._outage_failures} in all since the outage began,"
        return f"{text} over {self.elapsed_s:.1f} s"
