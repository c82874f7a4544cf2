"""The epoch pipeline alone: rank shares, exact batches, resumption (a fake loader, no network)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hapi_client import ConfigurationError, DeliveryError
from hapi_client.options import prefetch_depth
from hapi_client.pipeline import (
    EpochCounters,
    LoadedShard,
    iterate_batches,
    plan_epoch,
    rank_share,
)


class _Shards:
    """Shard k holds samples whose input is (k, i): every delivered sample names itself."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.loaded: list[int] = []

    def __call__(self, k: int) -> LoadedShard:
        self.loaded.append(k)
        n = self.sizes[k]
        ids = torch.stack([torch.full((n,), k), torch.arange(n)], dim=1)
        return LoadedShard(ids, torch.arange(n) % 3, 100 * n, 1)


def _epoch(
    sizes: list[int], batch: int, *, rank: int = 0, world: int = 1, start: int = 0, seed: int = 5
) -> tuple[list[list[tuple[int, int]]], _Shards]:
    plan = plan_epoch(len(sizes), seed, 2)
    shards, cuts = rank_share(plan.shard_order, sizes, batch, rank, world)
    loader = _Shards(sizes)
    with ThreadPoolExecutor(2) as pool:
        out = [
            [tuple(map(int, row)) for row in x]
            for x, _ in iterate_batches(
                plan,
                sizes,
                loader,
                batch,
                pool,
                2,
                EpochCounters(),
                shards=shards,
                batch_sizes=cuts,
                start_batch=start,
            )
        ]
    return out, loader  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("sizes", "batch", "world"),
    [
        ([10] * 8, 8, 1),
        ([7] * 11 + [3], 8, 2),  # uneven: 42 and 38 samples
        ([7] * 11 + [3], 5, 3),
        ([1000, 1000, 1000, 17], 64, 2),  # one rank has 2017 samples, the other 1000
        ([4, 4, 4, 4, 1], 4, 4),
    ],
)
def test_ranks_share_an_epoch_exactly_once_with_equal_batch_counts(
    sizes: list[int], batch: int, world: int
) -> None:
    seen: list[tuple[int, int]] = []
    counts = set()
    for rank in range(world):
        batches, _ = _epoch(sizes, batch, rank=rank, world=world)
        counts.add(len(batches))
        assert all(1 <= len(b) <= batch for b in batches)
        seen += [s for b in batches for s in b]
    assert len(counts) == 1  # DDP's collectives never wait on a rank that ran out
    assert sorted(seen) == sorted((k, i) for k, n in enumerate(sizes) for i in range(n))


def test_batch_sizes_full_then_rest_or_spread_evenly() -> None:
    assert rank_share([2, 0, 1], [10, 10, 5], 8)[1] == [8, 8, 8, 1]
    # Ranks' shards are disjoint, in the epoch's order, and balanced by samples.
    assert rank_share([3, 1, 0, 2], [5] * 4, 5, rank=1, world_size=2)[0] == [1, 2]
    assert rank_share([0, 1, 2, 4, 3], [4, 4, 4, 4, 1], 4, rank=3, world_size=4) == ([4, 3], [4, 1])
    assert rank_share([0, 1, 2, 4, 3], [4, 4, 4, 4, 1], 4, rank=0, world_size=4) == ([0], [2, 2])
    # 2000 and 1000 samples at batch 64: 32 batches each; the smaller rank spreads its 1000.
    big = rank_share([0, 1, 2], [1000] * 3, 64, rank=0, world_size=2)[1]
    small = rank_share([0, 1, 2], [1000] * 3, 64, rank=1, world_size=2)[1]
    assert big == [64] * 31 + [16] and small == [32] * 8 + [31] * 24


def test_shares_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="3 shards cannot give each of 4 ranks"):
        rank_share([0, 1, 2], [5, 5, 5], 2, 0, 4)
    with pytest.raises(ConfigurationError, match="out of range"):
        rank_share([0, 1], [5, 5], 2, 2, 2)


@pytest.mark.parametrize("world", [1, 2])
def test_resuming_at_any_batch_continues_the_same_sequence(world: int) -> None:
    sizes = [7] * 11 + [3]
    whole, _ = _epoch(sizes, 8, rank=world - 1, world=world)
    for start in range(len(whole) + 1):
        rest, loader = _epoch(sizes, 8, rank=world - 1, world=world, start=start)
        assert rest == whole[start:]
        # Shards wholly delivered before the resumption point are not read again.
        done = {s for b in whole[:start] for s in b}
        untouched = [k for k in set(loader.loaded) if all((k, i) in done for i in range(sizes[k]))]
        assert untouched == []


def test_a_shard_with_missing_samples_fails_loudly() -> None:
    plan = plan_epoch(2, 0, 0)

    def short(k: int) -> LoadedShard:
        return LoadedShard(torch.zeros(3, 1), torch.zeros(3, dtype=torch.int64), 0, 1)

    with ThreadPoolExecutor(1) as pool, pytest.raises(DeliveryError, match="manifest says 4"):
        list(iterate_batches(plan, [4, 4], short, 2, pool, 1, EpochCounters()))


class _CountingPool(ThreadPoolExecutor):
    """Counts the loads asked for (submitted), whether or not a thread has started them."""

    submitted = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_depth_shards_are_in_flight_while_a_shard_is_consumed(depth: int) -> None:
    """While the caller trains on shard k's batch, shards k+1 .. k+depth were already asked
    for: the server never waits for the trainer to finish before it gets the next request."""
    sizes = [4] * 6
    plan = plan_epoch(len(sizes), 3, 0)
    asked_at_yield = []
    with _CountingPool(depth) as pool:
        for _ in iterate_batches(plan, sizes, _Shards(sizes), 4, pool, depth, EpochCounters()):
            asked_at_yield.append(pool.submitted)
    consumed = range(1, len(sizes) + 1)
    assert asked_at_yield == [min(len(sizes), k + depth) for k in consumed]


@pytest.mark.parametrize(
    ("prefetch", "batch", "shard", "ordered", "depth"),
    [
        (None, 50, 50, False, 2),  # one shard a batch, plus the next
        (None, 50, 50, True, 3),  # in order: one arriving, one ready, one being computed
        (None, 200, 50, True, 5),  # four shards a batch, plus the next
        (2, 50, 50, True, 2),  # given: kept
    ],
)
def test_shards_in_flight(
    prefetch: int | None, batch: int, shard: int, ordered: bool, depth: int
) -> None:
    assert prefetch_depth(prefetch, batch, shard, ordered=ordered) == depth
