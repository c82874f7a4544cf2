"""RetryPolicy / RetryClock: a time budget from the first failure, not a count (unit tests).

A fake monotonic clock and a recording sleep stand in for time, so the budget arithmetic is
checked exactly and the tests never wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from swiftclient.client import ClientException

import hapi_client.retry as retry_module
from hapi_client import (
    ConfigurationError,
    HapiClient,
    SwiftCredentials,
    SwiftSession,
    SwiftUnavailableError,
)
from hapi_client.retry import DEFAULT_RETRY_BUDGET_S, Outage, RetryEvent, RetryPolicy
from hapi_client.transport import HapiTransport


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(retry_module.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(retry_module.time, "sleep", fake.sleep)
    return fake


def _retries_until_give_up(policy: RetryPolicy, fake: FakeTime, attempt_s: float = 0.0) -> int:
    clock = policy.clock("test")
    failures = 0
    while True:
        fake.now += attempt_s  # the failed attempt itself takes time too
        failures += 1
        if not clock.wait("boom"):
            return failures


def test_the_budget_counts_time_from_the_first_failure(fake_time: FakeTime) -> None:
    policy = RetryPolicy(budget_s=30.0, backoff_s=0.5, max_backoff_s=4.0)
    start = fake_time.now
    failures = _retries_until_give_up(policy, fake_time, attempt_s=0.1)
    # The last attempt starts no later than the end of the budget, and nothing sleeps past it.
    assert sum(fake_time.slept) <= 30.0
    assert fake_time.now - start >= 30.0
    assert all(pause <= 4.0 for pause in fake_time.slept)
    # Many short attempts fit: the count follows from the time, not the other way round.
    assert failures > 8


def test_a_longer_budget_outlasts_a_longer_outage(fake_time: FakeTime) -> None:
    short = _retries_until_give_up(RetryPolicy(budget_s=5.0), fake_time)
    spent_short = sum(fake_time.slept)
    fake_time.slept.clear()
    long = _retries_until_give_up(RetryPolicy(budget_s=50.0), fake_time)
    assert long > short and sum(fake_time.slept) > spent_short


def test_no_budget_means_no_retry(fake_time: FakeTime) -> None:
    assert _retries_until_give_up(RetryPolicy(budget_s=0.0), fake_time) == 1
    assert fake_time.slept == []


def test_an_attempt_cap_still_applies_when_given(fake_time: FakeTime) -> None:
    assert _retries_until_give_up(RetryPolicy(budget_s=1e6, attempts=3), fake_time) == 3


def test_retry_after_is_honoured_up_to_the_longest_pause(fake_time: FakeTime) -> None:
    clock = RetryPolicy(budget_s=60.0, max_backoff_s=4.0).clock("test")
    assert clock.wait("503", retry_after="2")
    assert clock.wait("503", retry_after="30")
    assert fake_time.slept == [2.0, 4.0]


def test_on_retry_reports_each_retried_failure(fake_time: FakeTime) -> None:
    events: list[RetryEvent] = []
    policy = RetryPolicy(budget_s=1.0, backoff_s=0.5, max_backoff_s=0.5, on_retry=events.append)
    failures = _retries_until_give_up(policy, fake_time)
    # Every failure but the last (which gives up) is announced, with its pause.
    assert [e.failures for e in events] == list(range(1, failures))
    assert all(e.what == "test" and e.reason == "boom" for e in events)
    assert [e.pause_s for e in events] == fake_time.slept


def test_policies_are_checked() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        RetryPolicy(budget_s=-1)
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_the_client_takes_a_budget() -> None:
    creds = SwiftCredentials("http://127.0.0.1:9/auth/v1.0")
    with HapiClient("http://127.0.0.1:9", creds, retry_budget_s=7.5) as client:
        assert client.retry.budget_s == 7.5
        assert client.transport.retry is client.retry and client.swift.retry is client.retry
    with HapiClient("http://127.0.0.1:9", creds) as client:
        assert client.retry.budget_s == DEFAULT_RETRY_BUDGET_S
    with pytest.raises(ConfigurationError):
        HapiClient("http://127.0.0.1:9", creds, retry_budget_s=-1)
    with pytest.raises(ConfigurationError, match="not both"):
        HapiClient("http://127.0.0.1:9", creds, retry=RetryPolicy(), retry_budget_s=1)


# --- One outage, one budget, whatever the threads do (issue 28, case 10) ---------------------
#
# Memcached down: the token the client holds is refused (401) and every new login answers 503.
# The time is an injected fake clock shared by every thread (RetryPolicy.clock_fn/sleep_fn).

BUDGET_S = 120.0
STORAGE_URL = "http://swift.invalid/v1/AUTH_test"


class LockedFakeTime(FakeTime):
    """FakeTime for several threads; ``on_first_sleep`` runs in the first thread that pauses."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.on_first_sleep: Callable[[], None] | None = None

    def sleep(self, seconds: float) -> None:
        with self._lock:
            hook, self.on_first_sleep = self.on_first_sleep, None
        if hook is not None:
            hook()
        with self._lock:
            super().sleep(seconds)


class FakeAuth:
    """The auth endpoint of a swiftclient connection: tokens until ``down``, then 503."""

    def __init__(self) -> None:
        self.down = False
        self.logins = 0
        self.failed_logins = 0
        self._lock = threading.Lock()

    def get_auth(self) -> tuple[str, str]:
        with self._lock:
            self.logins += 1
            if self.down:
                self.failed_logins += 1
                raise ClientException("Authorization Failure", http_status=503)
            return STORAGE_URL, f"token-{self.logins}"


@dataclass
class MemcachedDown:
    time: LockedFakeTime
    auth: FakeAuth
    session: SwiftSession
    transport: HapiTransport
    stale: str

    def extract_stale(self, name: str) -> object:
        """An extraction whose token the server refuses (401) until a login succeeds."""

        def send(url: str, headers: dict[str, str]) -> object:
            if headers["X-Auth-Token"] == self.stale:
                return httpx.Response(401, json={"detail": "token refused", "code": "auth"})
            return "features"

        return self.transport._request(f"extracting {name}", "c", name, "extract", send)[0]

    def extract_served(self, name: str) -> object:
        """An extraction that succeeds whatever the token (e.g. features the server had)."""
        return self.transport._request(
            f"extracting {name}", "c", name, "extract", lambda url, headers: "features"
        )[0]


@pytest.fixture
def memcached_down(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemcachedDown]:
    fake = LockedFakeTime()
    policy = RetryPolicy(budget_s=BUDGET_S, clock_fn=fake.monotonic, sleep_fn=fake.sleep)
    auth = FakeAuth()
    session = SwiftSession(SwiftCredentials("http://swift.invalid/auth/v1.0"), retry=policy)
    monkeypatch.setattr(session, "_conn", lambda: auth)
    _, stale = session.auth()
    auth.down = True
    transport = HapiTransport("http://hapi.invalid", session, retry=policy)
    yield MemcachedDown(fake, auth, session, transport, stale)
    transport.close()


def test_a_later_login_gets_no_fresh_budget_after_an_extraction_succeeded(
    memcached_down: MemcachedDown,
) -> None:
    env = memcached_down
    start = env.time.now
    with pytest.raises(SwiftUnavailableError) as first:
        env.extract_stale("shard-0")
    spent = env.auth.failed_logins
    # An extraction that succeeds ends the server's outage, not the auth endpoint's.
    assert env.extract_served("shard-1") == "features"
    with pytest.raises(SwiftUnavailableError) as second:
        env.extract_stale("shard-2")
    # One budget from the outage's first failure, not one per thread or per request.
    assert env.time.now - start == pytest.approx(BUDGET_S)
    assert env.auth.failed_logins == spent + 1  # one more attempt, not another budget's worth
    assert f"({spent} attempts over 120.0 s)" in str(first.value)
    assert f"1 attempt, {spent + 1} in all since the outage began, over 120.0 s" in str(
        second.value
    )
    assert second.value.endpoint == "auth" and second.value.status == 503


def test_threads_share_the_login_in_flight_and_its_budget(memcached_down: MemcachedDown) -> None:
    env = memcached_down
    start = env.time.now
    served: list[object] = []
    failures: list[BaseException] = []

    def served_meanwhile() -> None:
        served.append(env.extract_served("shard-1"))

    def stale_meanwhile() -> None:
        try:
            env.extract_stale("shard-2")
        except BaseException as exc:  # noqa: BLE001 - checked below
            failures.append(exc)

    others: list[threading.Thread] = []
    served_during_the_login: list[object] = []

    def during_the_first_login() -> None:
        # A thread that holds a token must not wait for the login in flight...
        served_thread = threading.Thread(target=served_meanwhile)
        served_thread.start()
        served_thread.join(timeout=10)
        served_during_the_login.extend(served)
        others.append(served_thread)
        # ...and one that needs a new token joins it (or, if it comes too late, fails at once).
        stale_thread = threading.Thread(target=stale_meanwhile)
        stale_thread.start()
        others.append(stale_thread)

    env.time.on_first_sleep = during_the_first_login
    with pytest.raises(SwiftUnavailableError) as first:
        env.extract_stale("shard-0")
    for thread in others:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert served_during_the_login == ["features"]  # while the login was still retrying
    assert len(failures) == 1 and isinstance(failures[0], SwiftUnavailableError)
    assert failures[0].endpoint == "auth"
    assert env.time.now - start == pytest.approx(BUDGET_S)
    assert "over 120.0 s" in str(first.value) and "over 120.0 s" in str(failures[0])


def test_a_success_that_started_before_the_outage_does_not_end_it() -> None:
    fake = FakeTime()
    policy = RetryPolicy(budget_s=10.0, clock_fn=fake.monotonic, sleep_fn=fake.sleep)
    outage = Outage()
    streaming = policy.clock("a stream started before the outage", outage)
    streaming.attempt()
    fake.now += 1
    failing = policy.clock("a request that fails", outage)
    assert failing.wait("503")
    since = outage.since
    fake.now += 1
    streaming.succeeded()
    assert outage.since == since  # still the same outage
    late = policy.clock("a request sent after", outage)
    late.attempt()
    late.succeeded()
    assert outage.since is None


def test_a_clock_serving_a_request_gives_up_when_the_request_budget_is_spent() -> None:
    fake = FakeTime()
    policy = RetryPolicy(budget_s=10.0, clock_fn=fake.monotonic, sleep_fn=fake.sleep)
    request = policy.clock("request")
    assert request.wait("503")
    fake.now += 9.5
    login = policy.clock("login", Outage(), parent=request)
    pause = login.failed()
    assert pause is not None and pause <= 0.5 + 1e-9
    fake.now += 1
    assert login.failed() is None
    assert login.summary().endswith(f"over {fake.now - 1000.0:.1f} s")
