"""Epoch plans and the prefetching shard pipeline that turns shards into exact training batches.

Every mode walks an epoch the same way: shards in an order shuffled per epoch from the seed,
samples within a shard permuted from the seed, consecutive samples cut into batches of exactly
``batch_size`` (the last one of the epoch may be smaller). Loading shard ``k + 1 .. k + depth``
runs in worker threads while shard ``k`` is consumed. The pipeline counts what it delivers and
fails loudly if an epoch did not deliver every sample exactly once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from hapi_contract.epochs import EpochPlan, plan_epoch

from .errors import ConfigurationError, DeliveryError

__all__ = [
    "EpochCounters",
    "EpochPlan",
    "LoadedShard",
    "ShardLoader",
    "iterate_batches",
    "plan_epoch",
    "rank_share",
]

log = logging.getLogger(__name__)
status = logging.getLogger("hapi_client.status")


@dataclass(frozen=True)
class LoadedShard:
    inputs: torch.Tensor
    labels: torch.Tensor
    wire_bytes: int
    requests: int
    """HTTP requests this load cost (0 for a cache hit)."""
    verified_samples: int = 0
    """Samples of this shard checked against a local recomputation (pushdown verification)."""


ShardLoader = Callable[[int], LoadedShard]


@dataclass
class EpochCounters:
    samples: int = 0
    wire_bytes: int = 0
    requests: int = 0
    iterations: int = 0
    #: Samples checked against a local recomputation (``verify_fraction``), and their shards.
    verified_samples: int = 0
    verified_shards: int = 0


def rank_share(
    shard_order: Sequence[int],
    shard_sizes: Sequence[int],
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[list[int], list[int]]:
    """Rank ``rank``'s shards (in visiting order) and the sizes of its batches for one epoch.

    Shards are dealt in the epoch's order, each to the rank holding the fewest samples so far
    (the lowest rank on a tie), so each rank reads only its own shards (pushdown stays per
    shard), together they cover the epoch exactly once, and ranks differ by at most one shard.
    Every rank gets the **same number of batches** K = ceil(largest rank's samples /
    batch_size), so that collective operations (DDP's all-reduce) never wait on a rank that has
    run out. A rank that can fill K - 1 full batches does, and its last one holds the rest (with
    one rank, the plain cut); a rank with fewer samples spreads them evenly over its K batches
    (never an empty one).

    Raises:
        ConfigurationError: fewer shards than ranks, or a rank with fewer samples than K.
    """
    if not 0 <= rank < world_size:
        raise ConfigurationError(f"rank {rank} out of range for world size {world_size}")
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
    if len(shard_order) < world_size:
        raise ConfigurationError(
            f"{len(shard_order)} shards cannot give each of {world_size} ranks a shard of its "
            "own; upload the dataset with a smaller --shard-size"
        )
    per_rank: list[list[int]] = [[] for _ in range(world_size)]
    samples = [0] * world_size
    for shard in shard_order:
        target = samples.index(min(samples))
        per_rank[target].append(shard)
        samples[target] += shard_sizes[shard]
    count = -(-max(samples) // batch_size)
    if min(samples) < count:
        raise ConfigurationError(
            f"a rank would hold {min(samples)} samples for {count} batches; use a smaller "
            "batch size or fewer ranks"
        )
    mine = samples[rank]
    if mine > (count - 1) * batch_size:
        sizes = [batch_size] * (count - 1) + [mine - (count - 1) * batch_size]
    else:
        base, extra = divmod(mine, count)
        sizes = [base + 1] * extra + [base] * (count - extra)
    return per_rank[rank], sizes


def iterate_batches(
    plan: EpochPlan,
    shard_sizes: Sequence[int],
    loader: ShardLoader,
    batch_size: int,
    executor: ThreadPoolExecutor,
    depth: int,
    counters: EpochCounters,
    *,
    permute: bool = True,
    shards: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
    start_batch: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(inputs, labels)`` batches for one epoch; see the module docstring.

    ``shards`` (default: the plan's whole order) and ``batch_sizes`` (default: ``batch_size``
    each, the last one smaller) describe one rank's share (:func:`rank_share`).
    ``start_batch`` resumes the epoch after that many batches: shards wholly before it are not
    loaded, and the samples of a partly consumed shard that were delivered are dropped, so the
    rest of the epoch is exactly what an uninterrupted run would have yielded.
    """
    order = list(plan.shard_order if shards is None else shards)
    total = sum(shard_sizes[s] for s in order)
    if batch_sizes is None:
        full, rest = divmod(total, batch_size)
        batch_sizes = [batch_size] * full + ([rest] if rest else [])
    if sum(batch_sizes) != total or any(b < 1 for b in batch_sizes):
        raise ConfigurationError(f"batch sizes {list(batch_sizes)} do not cut {total} samples")
    if not 0 <= start_batch <= len(batch_sizes):
        raise ConfigurationError(f"start batch {start_batch} outside [0, {len(batch_sizes)}]")
    skip = sum(batch_sizes[:start_batch])
    while order and skip >= shard_sizes[order[0]]:
        skip -= shard_sizes[order.pop(0)]
    cuts = deque(batch_sizes[start_batch:])
    expected = sum(cuts)
    pending: deque[tuple[int, Future[LoadedShard]]] = deque()
    next_i = 0
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    buffered = 0
    delivered = 0

    announced = False

    def refill() -> None:
        nonlocal next_i
        while next_i < len(order) and len(pending) < max(1, depth):
            if next_i == 0:
                status.info(
                    "first shard requested (%d shards, %d in flight)", len(order), max(1, depth)
                )
            pending.append((order[next_i], executor.submit(loader, order[next_i])))
            next_i += 1

    try:
        refill()
        while pending:
            shard, future = pending.popleft()
            # Refill before this shard is consumed, not after: while the caller trains on its
            # batches, ``depth`` further shards are in flight, so the server (or the link) is
            # never idle waiting for the next request. But never after a failure: a shard that
            # already failed is read first, and one that fails while waited on is raised before
            # anything new is sent (a new request during an outage would only make the exit of
            # the pool wait for it).
            if not future.done():
                refill()
            loaded = future.result()
            if not announced:
                announced = True
                status.info("first shard delivered (%d samples)", len(loaded.labels))
            refill()
            n = len(loaded.labels)
            if n != shard_sizes[shard] or loaded.inputs.shape[0] != n:
                raise DeliveryError(
                    f"shard {shard} delivered {n} samples, the manifest says {shard_sizes[shard]}"
                )
            counters.wire_bytes += loaded.wire_bytes
            counters.requests += loaded.requests
            if loaded.verified_samples:
                counters.verified_samples += loaded.verified_samples
                counters.verified_shards += 1
            if permute:
                index = plan.permutation(shard, n)[skip:]
                xs.append(loaded.inputs[index])
                ys.append(loaded.labels[index])
            else:
                xs.append(loaded.inputs[skip:])
                ys.append(loaded.labels[skip:])
            buffered += n - skip
            skip = 0
            while cuts and buffered >= cuts[0]:
                size = cuts.popleft()
                x, y, xs, ys = _cut(xs, ys, size)
                buffered -= size
                delivered += size
                counters.samples += size
                counters.iterations += 1
                yield x, y
    finally:
        for _, future in pending:
            future.cancel()
    if delivered != expected or buffered:
        raise DeliveryError(f"epoch delivered {delivered} samples instead of {expected}")


def _cut(
    xs: list[torch.Tensor], ys: list[torch.Tensor], size: int
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    x_all = torch.cat(xs) if len(xs) > 1 else xs[0]
    y_all = torch.cat(ys) if len(ys) > 1 else ys[0]
    rest_x, rest_y = x_all[size:], y_all[size:]
    return (
        x_all[:size],
        y_all[:size],
        [rest_x] if len(rest_x) else [],
        [rest_y] if len(rest_y) else [],
    )
