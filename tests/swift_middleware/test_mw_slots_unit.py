"""The in-proxy slots: a bounded wait for one, refused with the core's 503 / 504."""

from __future__ import annotations

import time

import eventlet
import pytest

from hapi_core.errors import QueueFullError, RequestTimeoutError
from swift_middleware.slots import Slots

LATER = 3600.0  # a deadline no test reaches


def _waiter(slots: Slots, taken: list[int], index: int) -> None:
    slots.acquire(time.monotonic() + LATER, f"r{index}")
    taken.append(index)


def test_a_free_slot_is_taken_at_once() -> None:
    slots = Slots(2, queue_limit=1, retry_after_s=7)
    slots.acquire(time.monotonic() + LATER, "a")
    slots.acquire(time.monotonic() + LATER, "b")
    assert (slots.busy, slots.waiting) == (2, 0)
    slots.release()
    assert slots.busy == 1


def test_beyond_queue_limit_waiters_a_request_gets_503_with_retry_after_at_once() -> None:
    slots = Slots(1, queue_limit=2, retry_after_s=7)
    slots.acquire(time.monotonic() + LATER, "holder")
    taken: list[int] = []
    waiters = [eventlet.spawn(_waiter, slots, taken, i) for i in range(2)]
    while slots.waiting < 2:
        eventlet.sleep(0)
    with pytest.raises(QueueFullError) as refused:
        slots.acquire(time.monotonic() + LATER, "third")
    assert refused.value.status == 503 and refused.value.code == "queue_full"
    assert refused.value.headers == {"Retry-After": "7"}
    assert "queue_limit" in refused.value.detail
    # The waiters are still served, one per release.
    slots.release()
    while not taken:
        eventlet.sleep(0)
    assert len(taken) == 1 and slots.waiting == 1
    slots.release()
    for waiter in waiters:
        waiter.wait()
    assert sorted(taken) == [0, 1] and slots.waiting == 0


def test_a_wait_past_the_deadline_is_a_504_and_leaves_the_queue() -> None:
    slots = Slots(1, queue_limit=4, retry_after_s=7)
    slots.acquire(time.monotonic() + LATER, "holder")
    with pytest.raises(RequestTimeoutError) as timed_out:
        slots.acquire(time.monotonic() + 0.05, "late")
    assert timed_out.value.status == 504 and "late" in timed_out.value.detail
    assert slots.waiting == 0 and slots.busy == 1
    # A deadline already past refuses without waiting.
    with pytest.raises(RequestTimeoutError):
        slots.acquire(time.monotonic() - 1, "past")
    slots.release()
    slots.acquire(time.monotonic() - 1, "free")  # a free slot is taken whatever the deadline
    assert slots.busy == 1
