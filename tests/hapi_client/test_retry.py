"""RetryPolicy / RetryClock: a time budget from the first failure, not a count (unit tests).

A fake monotonic clock and a recording sleep stand in for time, so the budget arithmetic is
checked exactly and the tests never wait.
"""

from __future__ import annotations

import pytest

import hapi_client.retry as retry_module
from hapi_client import ConfigurationError, HapiClient, SwiftCredentials
from hapi_client.retry import DEFAULT_RETRY_BUDGET_S, RetryEvent, RetryPolicy


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
