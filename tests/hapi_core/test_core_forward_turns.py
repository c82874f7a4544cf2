"""Turns at a CPU's cores for forward passes (:class:`hapi_core.ForwardTurns`)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import pytest

from hapi_core import ForwardTurns, RequestTimeoutError

BOUND_S = 30.0  # a bound for waits that end at once in a healthy run


def _until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) until ``condition`` holds: another thread's state, not a duration."""
    deadline = time.monotonic() + BOUND_S
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        pause.wait(0.001)


def _waiting(turns: ForwardTurns, count: int) -> bool:
    return turns.waiting == count


def _waiter(
    turns: ForwardTurns, owner: str, arrived: float, served: list[str], name: str
) -> threading.Thread:
    def run() -> None:
        with turns.turn(owner, arrived, BOUND_S):
            served.append(name)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def test_a_freed_turn_goes_to_the_least_recently_served_owner_and_then_its_oldest_request() -> None:
    turns = ForwardTurns(1)
    served: list[str] = []
    threads = []
    with turns.turn("holder", 0.0, BOUND_S):
        # Queued in this order; the rule, not the queue's order, decides.
        for owner, arrived, name in (
            ("a", 2.0, "a-newer"),
            ("b", 3.0, "b"),
            ("a", 1.0, "a-older"),
            ("holder", 0.5, "holder-again"),
        ):
            threads.append(_waiter(turns, owner, arrived, served, name))
            _until(functools.partial(_waiting, turns, len(threads)))
    for thread in threads:
        thread.join(BOUND_S)
    # Never-served owners first, oldest request first ("a" at 1.0, then "b"); the owner that
    # held the turn last comes after them; "a" was served more recently than "holder" then.
    assert served == ["a-older", "b", "holder-again", "a-newer"]
    assert turns.waiting == 0


def test_no_more_forward_passes_run_at_once_than_the_slots() -> None:
    turns = ForwardTurns(2)
    inside = 0
    most = 0
    lock = threading.Lock()
    release = threading.Event()

    def run(i: int) -> None:
        nonlocal inside, most
        with turns.turn(f"owner-{i % 3}", float(i), BOUND_S):
            with lock:
                inside += 1
                most = max(most, inside)
            release.wait(BOUND_S)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    _until(lambda: turns.waiting == 4)  # two hold the turns, four wait
    assert inside == 2
    release.set()
    for t in threads:
        t.join(BOUND_S)
    assert most == 2
    assert turns.waiting == 0


def test_a_wait_past_its_bound_is_a_timeout_and_leaves_the_turns_whole() -> None:
    turns = ForwardTurns(1)
    errors: list[BaseException] = []

    def late() -> None:
        try:
            with turns.turn("b", 1.0, 0.05):
                pass
        except RequestTimeoutError as exc:
            errors.append(exc)

    with turns.turn("a", 0.0, BOUND_S):
        thread = threading.Thread(target=late)
        thread.start()
        thread.join(BOUND_S)
        assert turns.waiting == 0
    assert len(errors) == 1
    assert "turn at the CPU's cores" in str(errors[0])
    # The freed turn is free: the next one is had at once, and a body's error frees it too.
    with pytest.raises(KeyError), turns.turn("c", 2.0, 0.0):
        raise KeyError("the body failed")
    with turns.turn("c", 3.0, 0.0):
        assert turns.waiting == 0


def test_slots_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ForwardTurns(0)
