"""LB-BSP balancer against a simulated cluster where worker i takes a_i * b_i seconds."""

from __future__ import annotations

import random

import pytest

from hapi_client.robust import (
    BalancingError,
    BatchBalancer,
    InvalidParameterError,
    RobustAggregationError,
    even_split,
    near_memory_limit,
)


def simulate(
    balancer: BatchBalancer,
    speeds: list[float],
    iterations: int,
    memory_cap: list[int] | None = None,
    noise: float = 0.0,
    seed: int = 0,
) -> list[tuple[int, ...]]:
    """Run the balancer; returns the assignment after each iteration and checks invariants."""
    rng = random.Random(seed)
    history = []
    for _ in range(iterations):
        sizes = balancer.assignment
        times = [
            a * b * (1.0 + noise * rng.uniform(-1, 1)) for a, b in zip(speeds, sizes, strict=True)
        ]
        flags = None
        if memory_cap is not None:
            flags = [b >= cap for b, cap in zip(sizes, memory_cap, strict=True)]
        new = balancer.update(times, flags)
        assert sum(new) == balancer.global_batch
        assert min(new) >= 1
        history.append(new)
    return history


def max_time(speeds: list[float], sizes: tuple[int, ...] | list[int]) -> float:
    return max(a * b for a, b in zip(speeds, sizes, strict=True))


def test_converges_on_heterogeneous_cluster() -> None:
    speeds = [1.0, 2.0, 4.0, 8.0]  # seconds per sample
    balancer = BatchBalancer(128, 4)
    equal = max_time(speeds, even_split(128, 4))  # 8 * 32 = 256 s
    history = simulate(balancer, speeds, 400)
    final = history[-1]
    optimum = 128 / sum(1 / a for a in speeds)  # continuous equilibrium, ~68.3 s
    assert max_time(speeds, final) < 0.5 * equal
    assert max_time(speeds, final) <= 1.1 * optimum
    assert final[0] > final[1] > final[2] > final[3]
    assert balancer.phase.name == "fine"


def test_first_move_is_five_samples_after_a_window_of_five() -> None:
    balancer = BatchBalancer(40, 2)
    speeds = [1.0, 3.0]
    history = simulate(balancer, speeds, 5)
    assert history[:4] == [(20, 20)] * 4  # not enough observations yet
    assert history[4] == (25, 15)
    assert balancer.phase.name == "fast"


def test_oscillation_switches_to_fine_tune_steps_of_one_over_twenty() -> None:
    balancer = BatchBalancer(100, 2)
    speeds = [1.0, 2.0]
    history = simulate(balancer, speeds, 200)
    assert balancer.phase.name == "fine"
    switch = next(i for i in range(1, len(history)) if abs(history[i][0] - history[i - 1][0]) == 1)
    deltas = [abs(history[i][0] - history[i - 1][0]) for i in range(switch, len(history))]
    assert set(deltas) <= {0, 1}
    assert 66 <= history[-1][0] <= 68  # equilibrium x0 = 2 * x1, x0 + x1 = 100
    assert max_time(speeds, history[-1]) < max_time(speeds, [50, 50])


def test_fine_phase_waits_twenty_iterations_after_order_flips() -> None:
    # Fast-phase parameters set to the fine-tune ones, to watch a 1/20 window from the start.
    balancer = BatchBalancer(100, 2, initial=[66, 34], fast_step=1, fast_window=20)
    for _ in range(19):
        assert balancer.update([66.0, 68.0]) == (66, 34)
    assert balancer.update([66.0, 68.0]) == (67, 33)
    # The order flips: worker 0, the former leader, is now the straggler -> fine-tune phase,
    # no move this iteration. Moving back needs 20 iterations with worker 1 ahead (this one
    # included).
    assert balancer.update([70.0, 60.0]) == (67, 33)
    assert balancer.phase.name == "fine"
    for _ in range(18):
        assert balancer.update([67.0, 66.0]) == (67, 33)
    assert balancer.update([67.0, 66.0]) == (66, 34)


def test_memory_limited_worker_takes_no_more() -> None:
    speeds = [0.5, 2.0, 4.0]
    balancer = BatchBalancer(90, 3)
    history = simulate(balancer, speeds, 300, memory_cap=[35, 10_000, 10_000])
    assert max(h[0] for h in history) <= 35 + 5  # may reach the cap with one fast step
    assert history[-1][1] > 30  # the next fastest absorbed the load instead
    flags = near_memory_limit([0.5, 0.96, 0.95])
    assert flags == [False, True, False]


def test_all_workers_near_limit_means_no_move() -> None:
    balancer = BatchBalancer(30, 3)
    for _ in range(10):
        balancer.update([1.0, 2.0, 3.0], [True, True, True])
    assert balancer.assignment == (10, 10, 10)


def test_straggler_keeps_one_sample_and_is_flagged_for_removal() -> None:
    speeds = [1.0, 1.0, 1000.0]
    balancer = BatchBalancer(30, 3)
    simulate(balancer, speeds, 200)
    assert balancer.assignment[2] == 1
    assert balancer.removal_candidate == 2


def test_converges_with_noisy_times() -> None:
    speeds = [1.0, 1.5, 3.0, 6.0]
    balancer = BatchBalancer(256, 4)
    history = simulate(balancer, speeds, 600, noise=0.05, seed=4)
    assert max_time(speeds, history[-1]) < 0.6 * max_time(speeds, even_split(256, 4))


def test_offsets_and_even_split() -> None:
    assert even_split(10, 3) == [4, 3, 3]
    balancer = BatchBalancer(10, 3, initial=[5, 3, 2])
    assert balancer.offsets() == [(0, 5), (5, 8), (8, 10)]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"global_batch": 2, "n_workers": 3}, BalancingError),
        ({"global_batch": 10, "n_workers": 3, "initial": [5, 5]}, BalancingError),
        ({"global_batch": 10, "n_workers": 3, "initial": [5, 5, 1]}, BalancingError),
        ({"global_batch": 10, "n_workers": 2, "initial": [10, 0]}, InvalidParameterError),
        ({"global_batch": 10, "n_workers": 0}, InvalidParameterError),
        ({"global_batch": 10, "n_workers": 2, "fast_step": 0}, InvalidParameterError),
    ],
)
def test_constructor_validation(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        BatchBalancer(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, RobustAggregationError)


def test_update_validation() -> None:
    balancer = BatchBalancer(10, 2)
    with pytest.raises(BalancingError, match="expected 2 iteration times"):
        balancer.update([1.0])
    with pytest.raises(BalancingError):
        balancer.update([1.0, float("nan")])
    with pytest.raises(BalancingError):
        balancer.update([1.0, -1.0])
    with pytest.raises(BalancingError, match="memory flags"):
        balancer.update([1.0, 2.0], [True])
    assert balancer.iterations == 0
