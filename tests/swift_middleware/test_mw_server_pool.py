"""Round-robin and cached health checks of the HAPI server pool, with a fake clock and probe."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from swift_middleware import NoHapiServerError, ServerPool


@dataclass
class Probe:
    down: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)

    def __call__(self, url: str, timeout: float) -> str | None:
        self.calls.append(url)
        return "refused" if url in self.down else None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(urls: list[str], probe: Probe, clock: Clock, interval: float = 5.0) -> ServerPool:
    return ServerPool(urls, interval=interval, timeout=1.0, clock=clock, probe=probe)


def first(p: ServerPool) -> str:
    return next(p.candidates()).url


def test_rotates_and_checks_each_server_once_per_interval() -> None:
    probe, clock = Probe(), Clock()
    p = pool(["a", "b", "c"], probe, clock)
    assert [first(p) for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert probe.calls == ["a", "b", "c"]
    clock.now += 5.0
    first(p)
    assert probe.calls == ["a", "b", "c", "a"]


def test_a_server_down_is_skipped_until_it_passes_a_later_check() -> None:
    probe, clock = Probe(down={"b"}), Clock()
    p = pool(["a", "b", "c"], probe, clock)
    assert [first(p) for _ in range(4)] == ["a", "c", "a", "c"]
    probe.down.clear()
    assert first(p) == "a"  # b's failure is still trusted
    clock.now += 5.0
    assert [first(p) for _ in range(3)] == ["b", "c", "a"]


def test_candidates_are_checked_lazily() -> None:
    probe, clock = Probe(), Clock()
    p = pool(["a", "b"], probe, clock)
    assert first(p) == "a"
    assert probe.calls == ["a"]


def test_mark_down_takes_a_server_out_until_its_next_check() -> None:
    probe, clock = Probe(), Clock()
    p = pool(["a", "b"], probe, clock)
    server = next(p.candidates())
    p.mark_down(server, "connect failed: refused")
    assert [s.url for s in p.candidates()] == ["b"]
    clock.now += 5.0
    assert sorted(s.url for s in p.candidates()) == ["a", "b"]


def test_interval_zero_checks_before_every_request() -> None:
    probe, clock = Probe(), Clock()
    p = pool(["a"], probe, clock, interval=0)
    for _ in range(3):
        first(p)
    assert probe.calls == ["a", "a", "a"]


def test_all_down_says_why_for_each_server() -> None:
    probe, clock = Probe(down={"a", "b"}), Clock()
    p = pool(["a", "b"], probe, clock)
    assert list(p.candidates()) == []
    error = p.unavailable(7)
    assert isinstance(error, NoHapiServerError)
    assert (error.status, error.code, error.headers) == (
        503,
        "no_hapi_server",
        {"Retry-After": "7"},
    )
    assert "a: refused" in error.detail and "b: refused" in error.detail


def test_an_empty_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ServerPool([], interval=1, timeout=1)
