"""The shared epoch schedule: exactly once across workers, ownership, stealing, round sizes."""

from __future__ import annotations

import random

import pytest
import torch

from hapi_client.distributed import (
    EpochSchedule,
    ScheduleError,
    Segment,
    assign_shards,
    round_totals,
    scale_sizes,
)
from hapi_contract.epochs import plan_epoch


def _run_epoch(
    shard_sizes: list[int], n: int, batch: int, seed: int, sizes_for_round
) -> tuple[EpochSchedule, list[list[tuple[int, int]]]]:  # type: ignore[no-untyped-def]
    owners = assign_shards(shard_sizes, n)
    schedule = EpochSchedule(plan_epoch(len(shard_sizes), seed, 1), shard_sizes, owners)
    per_worker: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for k, total in enumerate(round_totals(schedule.total, batch, n)):
        sizes = scale_sizes(sizes_for_round(k), total)
        assert sum(sizes) == total and min(sizes) >= 1
        for r, segments in enumerate(schedule.take(sizes)):
            shards, idx = schedule.samples(segments)
            assert len(shards) == sizes[r]
            per_worker[r] += list(zip(shards.tolist(), idx.tolist(), strict=True))
    return schedule, per_worker


@pytest.mark.parametrize("seed", range(5))
def test_every_sample_exactly_once_under_changing_sizes(seed: int) -> None:
    rng = random.Random(seed)
    shard_sizes = [rng.randint(5, 40) for _ in range(rng.randint(3, 12))]
    n = rng.randint(1, 6)
    batch = rng.randint(n, 3 * n + 10)

    def sizes(_: int) -> list[int]:
        # An LB-BSP-like assignment that keeps changing, always summing to the global batch.
        cuts = sorted(rng.sample(range(1, batch), n - 1)) if n > 1 else []
        bounds = [0, *cuts, batch]
        return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]

    schedule, per_worker = _run_epoch(shard_sizes, n, batch, seed, sizes)
    everything = [s for worker in per_worker for s in worker]
    expected = [(s, i) for s, size in enumerate(shard_sizes) for i in range(size)]
    assert sorted(everything) == expected  # each (shard, index) exactly once
    assert schedule.remaining == 0


def test_equal_shares_keep_workers_on_their_own_shards() -> None:
    shard_sizes = [10] * 6
    owners = assign_shards(shard_sizes, 3)
    assert owners == [[0, 3], [1, 4], [2, 5]]
    _, per_worker = _run_epoch(shard_sizes, 3, 6, 0, lambda _: [2, 2, 2])
    for r in range(3):
        assert {s for s, _ in per_worker[r]} == set(owners[r])


def test_a_bigger_share_steals_from_the_tail_of_the_fullest_stream() -> None:
    shard_sizes = [10] * 4  # 2 workers own 20 samples each
    owners = assign_shards(shard_sizes, 2)
    schedule = EpochSchedule(plan_epoch(4, 0, 0), shard_sizes, owners)
    first = schedule.take([15, 5])
    assert first == [[Segment(0, 0, 15)], [Segment(1, 0, 5)]]
    second = schedule.take([8, 2])  # worker 0 has 5 left: 3 more come from worker 1's tail
    assert [(s.stream, s.start, s.stop) for s in second[0]] == [(0, 15, 20), (1, 17, 20)]
    assert [(s.stream, s.start, s.stop) for s in second[1]] == [(1, 5, 7)]
    assert schedule.remaining == 10


def test_ownership_balances_samples_of_unequal_shards() -> None:
    owners = assign_shards([100, 10, 10, 10, 100], 2)
    loads = [sum([100, 10, 10, 10, 100][s] for s in owned) for owned in owners]
    assert owners == [[0], [1, 2, 3, 4]] and loads == [100, 130]


def test_round_totals_merge_a_tail_too_small_for_every_worker() -> None:
    assert round_totals(100, 10, 4) == [10] * 10
    assert round_totals(103, 10, 4) == [10] * 9 + [13]  # 3 < 4 workers: merged
    assert round_totals(105, 10, 4) == [10] * 10 + [5]
    assert round_totals(7, 10, 4) == [7]
    with pytest.raises(ScheduleError, match="cannot give 4 workers"):
        round_totals(3, 10, 4)
    with pytest.raises(ScheduleError, match="global batch of 3"):
        round_totals(100, 3, 4)


def test_scale_sizes_keeps_proportions_and_one_sample_each() -> None:
    assert scale_sizes([5, 5], 10) == [5, 5]
    assert scale_sizes([30, 10], 8) == [6, 2]
    assert scale_sizes([38, 1, 1], 5) == [3, 1, 1]
    assert sum(scale_sizes([7, 3, 1, 9], 23)) == 23
    with pytest.raises(ScheduleError):
        scale_sizes([1, 1, 1], 2)


def test_take_refuses_more_than_is_left() -> None:
    schedule = EpochSchedule(plan_epoch(1, 0, 0), [4], [[0], []])
    assert schedule.upcoming_shards(0, 2) == [0] and schedule.upcoming_shards(1, 2) == []
    with pytest.raises(ScheduleError, match="only 4 left"):
        schedule.take([3, 2])
    with pytest.raises(ScheduleError, match="expected 2 batch sizes"):
        schedule.take([1])
    got = schedule.take([2, 2])
    assert [len(s) for s in got[1]] == [2]
    shards, idx = schedule.samples(got[0] + got[1])
    assert torch.equal(shards, torch.zeros(4, dtype=torch.int64))
    assert sorted(idx.tolist()) == [0, 1, 2, 3]


def test_foreign_shards_forecast_what_a_bigger_share_takes_without_consuming() -> None:
    shard_sizes = [10] * 6  # 3 workers own 2 shards (20 samples) each
    owners = assign_shards(shard_sizes, 3)
    schedule = EpochSchedule(plan_epoch(6, 0, 0), shard_sizes, owners)
    rounds = [[10, 5, 5]] * 3  # worker 0 needs 30 samples: 20 of its own, 10 from the others
    forecast = schedule.foreign_shards(0, rounds)
    assert schedule.remaining == 60  # a dry run
    taken = [s for sizes in rounds for s in schedule.take(sizes)[0]]
    used = {int(x) for x in schedule.samples(taken)[0].tolist()} - set(owners[0])
    assert set(forecast) == used and len(forecast) == len(used) > 0
    fresh = EpochSchedule(plan_epoch(6, 0, 0), shard_sizes, owners)
    assert fresh.foreign_shards(1, [[5, 5, 5]] * 4) == []  # equal shares stay on their own shards
