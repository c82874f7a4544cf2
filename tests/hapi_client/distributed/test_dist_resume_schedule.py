"""Resuming an epoch from its done mask: the same world continues the same rounds, another
world gets the remaining samples dealt again; every sample exactly once either way."""

from __future__ import annotations

import random

import pytest
import torch

from hapi_client.distributed import (
    EpochSchedule,
    ScheduleError,
    assign_shards,
    remaining_sizes,
    resumed_totals,
    round_totals,
    scale_sizes,
)
from hapi_contract.epochs import plan_epoch

Sample = tuple[int, int]


def _rounds(
    schedule: EpochSchedule, totals: list[int], n: int, rng: random.Random
) -> list[list[list[Sample]]]:
    """Per round, each worker's samples; the shares change every round (as under LB-BSP)."""
    out = []
    for total in totals:
        weights = [rng.randint(1, 9) for _ in range(n)]
        sizes = scale_sizes(weights, total)
        row = []
        for segments in schedule.take(sizes):
            shards, idx = schedule.samples(segments)
            row.append(list(zip(shards.tolist(), idx.tolist(), strict=True)))
        out.append(row)
    return out


def _flat(rounds: list[list[list[Sample]]]) -> list[Sample]:
    return [s for row in rounds for worker in row for s in worker]


@pytest.mark.parametrize("seed", range(6))
def test_a_resumed_epoch_in_the_same_world_trains_the_rounds_it_would_have(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.randint(5, 40) for _ in range(rng.randint(3, 12))]
    n = rng.randint(1, 5)
    batch = rng.randint(n, 3 * n + 10)
    plan = plan_epoch(len(sizes), seed, 2)
    owners = assign_shards(sizes, n)
    totals = round_totals(sum(sizes), batch, n)
    stop = rng.randint(0, len(totals))
    whole = _rounds(EpochSchedule(plan, sizes, owners), totals, n, random.Random(seed))

    first = EpochSchedule(plan, sizes, owners)
    share_rng = random.Random(seed)
    before = _rounds(first, totals[:stop], n, share_rng)
    done = first.done_mask()
    assert int(done.sum()) == len(_flat(before))
    resumed = EpochSchedule(plan, sizes, owners, done=done)
    rest = resumed_totals(sum(sizes), stop, resumed.total, batch, n)
    assert rest == totals[stop:]
    after = _rounds(resumed, rest, n, share_rng)
    assert before + after == whole
    assert bool(resumed.done_mask().all())


@pytest.mark.parametrize("seed", range(8))
def test_another_world_gets_the_remaining_samples_once(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.randint(5, 40) for _ in range(rng.randint(3, 12))]
    n1, n2 = rng.randint(1, 6), rng.randint(1, 6)
    batch = rng.randint(max(n1, n2), 3 * max(n1, n2) + 10)
    plan = plan_epoch(len(sizes), seed, 0)
    totals = round_totals(sum(sizes), batch, n1)
    stop = rng.randint(0, len(totals) - 1)
    first = EpochSchedule(plan, sizes, assign_shards(sizes, n1))
    before = _rounds(first, totals[:stop], n1, rng)
    done = first.done_mask()

    left = remaining_sizes(sizes, done)
    assert sum(left) == sum(sizes) - len(_flat(before))
    again = EpochSchedule(plan, sizes, assign_shards(left, n2), done=done)
    rest = resumed_totals(sum(sizes), stop, again.total, batch, n2)
    assert sum(rest) == again.total and all(t >= n2 for t in rest)
    after = _rounds(again, rest, n2, rng)
    everything = _flat(before) + _flat(after)
    expected = [(s, i) for s, size in enumerate(sizes) for i in range(size)]
    assert sorted(everything) == expected  # each sample exactly once
    assert bool(again.done_mask().all())


def test_a_mask_of_the_wrong_shape_or_owners_missing_samples_are_refused() -> None:
    plan = plan_epoch(2, 0, 0)
    with pytest.raises(ScheduleError, match="done mask"):
        EpochSchedule(plan, [3, 4], [[0, 1]], done=torch.zeros(6, dtype=torch.bool))
    with pytest.raises(ScheduleError, match="cover 3 of the epoch's 7"):
        EpochSchedule(plan, [3, 4], [[0]])


def test_a_finished_epoch_resumes_with_no_rounds() -> None:
    plan = plan_epoch(2, 0, 0)
    done = torch.ones(7, dtype=torch.bool)
    schedule = EpochSchedule(plan, [3, 4], [[0], [1]], done=done)
    assert schedule.total == 0
    assert resumed_totals(7, 1, 0, 4, 2) == []
