"""Unit tests of the batch-adaptation solver (``hapi_core.solver.solve``), thesis eq. 5.1.

Random instances come from seeded generators, so every run checks the same cases. The MILP
cross-check solves the same problem exactly with ``scipy.optimize.milp`` (HiGHS).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from hapi_core import Demand, Plan, solve
from hapi_core.solver import (
    InfeasibleRequestError,
    Releases,
    check_feasible_alone,
    effective_b_min,
)

MiB = 2**20


def demand(
    rid: str, d: int, b_min: int = 25, b_max: int = 100, arrival: float = 0.0, model: int = 0
) -> Demand:
    return Demand(rid, d, model, b_min, b_max, arrival)


def random_demands(rng: random.Random, n: int) -> list[Demand]:
    out = []
    for i in range(n):
        b_min = rng.randint(1, 30)
        out.append(
            Demand(
                request_id=f"r{i}",
                bytes_per_sample=rng.randint(1_000, 5 * MiB),
                model_bytes=rng.choice([0, 0, rng.randint(0, 50 * MiB)]),
                b_min=b_min,
                b_max=rng.randint(b_min, 400),
                arrival=rng.random() * 10,
            )
        )
    return out


def check_plan(demands: list[Demand], free: int, plan: Plan) -> None:
    """Invariants every plan must satisfy: bounds, budget, maximality, fairness, bookkeeping."""
    by_id = {d.request_id: d for d in demands}
    assert set(plan.batches) | set(plan.deferred) == set(by_id)
    assert not set(plan.batches) & set(plan.deferred)
    for rid, b in plan.batches.items():
        d = by_id[rid]
        assert d.b_min <= b <= d.b_max, (rid, b, d)
    planned = sum(by_id[r].footprint(b) for r, b in plan.batches.items())
    assert planned == plan.planned_bytes <= free == plan.free_bytes
    left = free - planned
    # Memory filled: nobody can grow by one sample without breaking the budget or its b_max.
    for rid, b in plan.batches.items():
        assert b == by_id[rid].b_max or by_id[rid].bytes_per_sample > left, (rid, b, left)
    # Fairness: the admitted requests are exactly the longest arrival-order prefix that fits at
    # b_min, so an older waiter is never deferred while a newer one runs.
    admitted = [by_id[r] for r in plan.batches]
    deferred = [by_id[r] for r in plan.deferred]
    if admitted and deferred:
        assert max(d.arrival for d in admitted) <= min(d.arrival for d in deferred)
    if deferred:
        first_out = min(deferred, key=lambda d: (d.arrival, d.footprint(d.b_min)))
        need = sum(d.footprint(d.b_min) for d in admitted) + first_out.footprint(first_out.b_min)
        assert need > free, "a deferred request would have fitted next to the admitted ones"


def test_single_request_gets_b_max_when_it_fits() -> None:
    plan = solve([demand("a", 1000, b_max=64)], 10 * MiB)
    assert plan.batches == {"a": 64} and plan.deferred == []
    assert plan.planned_bytes == 64_000


def test_single_request_is_cut_to_the_free_memory() -> None:
    plan = solve([demand("a", 1000, b_min=10, b_max=500, model=5_000)], 105_500)
    # (105_500 - 5_000) // 1_000 = 100 samples, 500 bytes left over (< one sample).
    assert plan.batches == {"a": 100}
    assert plan.planned_bytes == 105_000


def test_equal_requests_share_equally() -> None:
    demands = [demand(f"r{i}", 1000, b_min=10, b_max=1000, arrival=i) for i in range(4)]
    plan = solve(demands, 400_000)
    assert plan.batches == {f"r{i}": 100 for i in range(4)}


def test_capped_request_leaves_its_share_to_the_others() -> None:
    demands = [
        demand("small", 1000, b_min=5, b_max=20, arrival=0),
        demand("big1", 1000, b_min=5, b_max=1000, arrival=1),
        demand("big2", 1000, b_min=5, b_max=1000, arrival=2),
    ]
    plan = solve(demands, 300_000)
    assert plan.batches["small"] == 20
    assert plan.batches["big1"] + plan.batches["big2"] == 280
    assert abs(plan.batches["big1"] - plan.batches["big2"]) <= 1


def test_byte_equal_shares_give_heavy_samples_fewer_extra_samples() -> None:
    demands = [
        demand("light", 1_000, b_min=1, b_max=10_000, arrival=0),
        demand("heavy", 4_000, b_min=1, b_max=10_000, arrival=1),
    ]
    plan = solve(demands, 1_000_000)
    check_plan(demands, 1_000_000, plan)
    light, heavy = plan.batches["light"], plan.batches["heavy"]
    assert light > heavy
    # Each got about half of the bytes.
    assert abs(light * 1_000 - heavy * 4_000) <= 4_000


def test_everyone_at_b_max_when_memory_is_plenty() -> None:
    demands = [demand(f"r{i}", 10_000, b_min=5, b_max=50 + i, arrival=i) for i in range(5)]
    plan = solve(demands, 10**12)
    assert plan.batches == {f"r{i}": 50 + i for i in range(5)}


def test_latest_arrival_is_deferred_first() -> None:
    demands = [
        demand("old", 1_000, b_min=50, b_max=50, arrival=1.0),
        demand("new", 1_000, b_min=50, b_max=50, arrival=3.0),
        demand("mid", 1_000, b_min=50, b_max=50, arrival=2.0),
    ]
    plan = solve(demands, 120_000)
    assert set(plan.batches) == {"old", "mid"} and plan.deferred == ["new"]
    plan = solve(demands, 60_000)
    assert plan.batches == {"old": 50} and plan.deferred == ["new", "mid"]


def test_a_small_newcomer_never_overtakes_an_older_waiter() -> None:
    # The old request does not fit; the new one would. FCFS: both wait (no starvation of "old").
    demands = [
        demand("old", 1_000, b_min=100, b_max=100, arrival=1.0),
        demand("new", 1_000, b_min=1, b_max=1, arrival=2.0),
    ]
    plan = solve(demands, 50_000)
    assert plan.batches == {} and plan.deferred == ["new", "old"]
    assert plan.planned_bytes == 0


def test_arrival_ties_defer_the_larger_minimum_footprint_first() -> None:
    demands = [
        demand("light", 1_000, b_min=10, b_max=10, arrival=5.0),
        demand("heavy", 1_000, b_min=40, b_max=40, arrival=5.0),
    ]
    plan = solve(demands, 45_000)
    assert plan.batches == {"light": 10} and plan.deferred == ["heavy"]


def test_drop_and_retry_plans_the_rest_as_if_alone() -> None:
    rng = random.Random(7)
    for _ in range(200):
        demands = random_demands(rng, rng.randint(2, 12))
        free = rng.randint(0, 400 * MiB)
        plan = solve(demands, free)
        check_plan(demands, free, plan)
        if plan.deferred:
            rest = [d for d in demands if d.request_id in plan.batches]
            again = solve(rest, free)
            assert again.batches == plan.batches and again.deferred == []


def test_model_bytes_count_against_the_budget() -> None:
    plan = solve([demand("a", 1_000, b_min=10, b_max=1000, model=50_000)], 100_000)
    assert plan.batches == {"a": 50}
    plan = solve([demand("a", 1_000, b_min=10, b_max=1000, model=95_000)], 100_000)
    assert plan.batches == {} and plan.deferred == ["a"]


def test_no_free_memory_defers_everything() -> None:
    demands = [demand("a", 1), demand("b", 1, arrival=1)]
    for free in (0, -5):
        plan = solve(demands, free)
        assert plan.batches == {} and sorted(plan.deferred) == ["a", "b"]
        assert plan.free_bytes == 0


def test_empty_input() -> None:
    assert solve([], 1000) == Plan({}, [], 0, 1000)


@pytest.mark.parametrize("seed", range(5))
def test_random_instances_satisfy_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        demands = random_demands(rng, rng.randint(1, 20))
        total_min = sum(d.footprint(d.b_min) for d in demands)
        total_max = sum(d.footprint(d.b_max) for d in demands)
        free = rng.choice(
            [rng.randint(0, total_min), rng.randint(total_min, total_max), total_max * 2]
        )
        check_plan(demands, free, solve(demands, free))


def milp_optimum(demands: list[Demand], free: int) -> float:
    """The exact optimum of eq. 5.1 for a fixed set of requests, via HiGHS."""
    d = np.array([x.bytes_per_sample for x in demands], dtype=float)
    budget = free - sum(x.model_bytes for x in demands)
    res = milp(
        c=-d,
        integrality=np.ones(len(demands)),
        bounds=Bounds([x.b_min for x in demands], [x.b_max for x in demands]),
        constraints=LinearConstraint(d[np.newaxis, :], -np.inf, budget),
        options={"mip_rel_gap": 0.0},  # HiGHS stops at a 1e-4 gap by default: ask for the optimum
    )
    assert res.success, res.message
    x = np.round(res.x)
    # SciPy issue #22812: check the returned point really is feasible before trusting it.
    for value, y in zip(x, demands, strict=True):
        assert y.b_min <= value <= y.b_max
    assert float(d @ x) <= budget + 1e-6
    return float(d @ x) + sum(x.model_bytes for x in demands)


@pytest.mark.parametrize("seed", range(4))
def test_close_to_the_milp_optimum(seed: int) -> None:
    rng = random.Random(100 + seed)
    checked = 0
    for _ in range(60):
        demands = random_demands(rng, rng.randint(1, 6))
        # Small sample sizes make the integer effects visible.
        demands = [
            Demand(x.request_id, rng.randint(1, 5000), x.model_bytes, x.b_min, x.b_max, x.arrival)
            for x in demands
        ]
        total_min = sum(x.footprint(x.b_min) for x in demands)
        total_max = sum(x.footprint(x.b_max) for x in demands)
        free = rng.randint(total_min // 2, total_max)
        plan = solve(demands, free)
        admitted = [x for x in demands if x.request_id in plan.batches]
        if not admitted:
            continue
        optimum = milp_optimum(admitted, free)
        slack = max(x.bytes_per_sample for x in admitted)
        assert optimum - slack <= plan.planned_bytes <= optimum + 1e-6
        checked += 1
    assert checked >= 30


def test_effective_b_min_and_feasibility_alone() -> None:
    assert effective_b_min(25, 10) == 10 and effective_b_min(25, 100) == 25
    check_feasible_alone(demand("ok", 1_000, b_min=10, model=1_000), 11_000)
    with pytest.raises(InfeasibleRequestError) as info:
        check_feasible_alone(demand("big", 1_000, b_min=10, model=1_000), 10_999)
    assert (info.value.needed, info.value.capacity) == (11_000, 10_999)
    assert "11000" in str(info.value) and "10999" in str(info.value)


@pytest.mark.parametrize(
    ("d", "model", "b_min", "b_max"), [(0, 0, 1, 1), (1, -1, 1, 1), (1, 0, 0, 1), (1, 0, 5, 4)]
)
def test_demand_rejects_nonsense(d: int, model: int, b_min: int, b_max: int) -> None:
    with pytest.raises(ValueError):
        Demand("x", d, model, b_min, b_max, 0.0)


# --- The fairness rule's second case: a head that no release can place -----------------------


def test_a_head_no_release_can_place_lets_the_requests_that_fit_run() -> None:
    # "old" needs 100 kB; 50 kB are free and the running requests give nothing back (the rest
    # is pinned by waiters or outside the plan): waiting for a release would wait forever.
    demands = [
        demand("old", 1_000, b_min=100, b_max=100, arrival=1.0),
        demand("small", 1_000, b_min=10, b_max=10, arrival=2.0),
        demand("big", 1_000, b_min=45, b_max=45, arrival=3.0),
        demand("tiny", 1_000, b_min=5, b_max=5, arrival=4.0),
    ]
    plan = solve(demands, 50_000, reclaimable_bytes=0)
    # In arrival order, each one that still fits: "big" does not fit beside "small".
    assert plan.batches == {"small": 10, "tiny": 5}
    assert plan.deferred == ["big", "old"]
    assert plan.head == "old" and plan.backfilled == ("small", "tiny")
    assert plan.planned_bytes == 15_000


def test_a_head_that_releases_will_place_keeps_first_come_first_served() -> None:
    demands = [
        demand("old", 1_000, b_min=100, b_max=100, arrival=1.0),
        demand("new", 1_000, b_min=1, b_max=1, arrival=2.0),
    ]
    # 50 kB free + 50 kB the running requests give back = the head's 100 kB: everyone waits.
    plan = solve(demands, 50_000, reclaimable_bytes=50_000)
    assert plan.batches == {} and plan.deferred == ["new", "old"] and plan.backfilled == ()
    # One byte short of it: the head cannot be placed by any release, "new" runs meanwhile.
    plan = solve(demands, 50_000, reclaimable_bytes=49_999)
    assert plan.batches == {"new": 1} and plan.deferred == ["old"] and plan.head == "old"


def test_a_head_that_releases_will_place_lets_requests_run_within_its_slack() -> None:
    # Issue 27's livelock: "vit" waits for a running request's 60 kB (a pinned model and a
    # slow reader); 60 kB are free and it needs 100 kB: 20 kB it will never need.
    demands = [
        demand("vit", 1_000, b_min=100, b_max=100, arrival=1.0),
        demand("small", 1_000, b_min=5, b_max=30, arrival=2.0),
        demand("big", 1_000, b_min=25, b_max=25, arrival=3.0),
    ]
    running = Releases(running=((0.5, 60_000),))
    plan = solve(demands, 60_000, running)
    # "small" runs and grows only to the slack; "big" would delay "vit", so it waits.
    assert plan.batches == {"small": 20} and plan.backfilled == ("small",)
    assert plan.head == "vit" and plan.deferred == ["big", "vit"]
    # A round later "small" runs (it arrived after "vit"): its memory is not counted on for
    # "vit", so nothing more is planned behind it until the older request ends.
    running = Releases(running=((0.5, 60_000), (2.0, 20_000)))
    plan = solve(demands[::2], 40_000, running)
    assert plan.batches == {} and plan.head == "vit"
    # When the older request has ended, "vit" is placed first.
    plan = solve(demands[::2], 100_000, Releases(running=((2.0, 20_000),)))
    assert plan.batches == {"vit": 100} and plan.deferred == ["big"]


def test_releases_count_idle_memory_for_every_waiter_and_a_request_only_for_younger() -> None:
    releases = Releases(idle_bytes=7, running=((1.0, 10), (3.0, 100)))
    assert releases.total() == 117
    assert releases.before(0.5) == 7 and releases.before(1.0) == 17 and releases.before(5) == 117


@pytest.mark.parametrize("seed", range(3))
def test_backfilled_plans_keep_the_budget_and_the_order(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        demands = random_demands(rng, rng.randint(2, 12))
        free = rng.randint(0, 400 * MiB)
        plan = solve(demands, free, reclaimable_bytes=0)
        by_id = {d.request_id: d for d in demands}
        assert set(plan.batches) | set(plan.deferred) == set(by_id)
        assert plan.planned_bytes == sum(by_id[r].footprint(b) for r, b in plan.batches.items())
        assert plan.planned_bytes <= free
        # The arrival-order prefix that fits; then first fit in arrival order behind the head:
        # in what is free if it does not fit even alone (the prefix's end would not place it),
        # else only in its slack (what it leaves of the free memory).
        need, head, behind = 0, None, 0
        for d in sorted(demands, key=lambda d: (d.arrival, d.footprint(d.b_min))):
            if head is None:
                fits = need + d.footprint(d.b_min) <= free
                if not fits:
                    head, head_need = d, d.footprint(d.b_min)
                    behind = free - need if head_need > free else min(free - need, free - head_need)
            else:
                fits = d.footprint(d.b_min) <= behind
                behind -= d.footprint(d.b_min) if fits else 0
            assert (d.request_id in plan.batches) == fits, d.request_id
            need += d.footprint(d.b_min) if fits and head is None else 0
        assert plan.head == (head.request_id if head is not None else None)
        if head is not None and head.footprint(head.b_min) <= free:
            # Once the prefix ends, the head fits beside everything planned behind it.
            later = sum(by_id[r].footprint(plan.batches[r]) for r in plan.backfilled)
            assert later + head.footprint(head.b_min) <= free


def test_input_bytes_are_a_constant_term() -> None:
    d = Demand("a", 1_000, 5_000, 1, 100, 0.0, input_bytes=20_000)
    assert d.footprint(10) == 35_000
    plan = solve([d], 45_000)
    assert plan.batches == {"a": 20} and plan.planned_bytes == 45_000
    with pytest.raises(ValueError, match="input_bytes"):
        Demand("b", 1, 0, 1, 1, 0.0, input_bytes=-1)
