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

from hapi_contract import EpochPlan, plan_epoch

from .errors import DeliveryError

__all__ = [
    "EpochCounters",
    "EpochPlan",
    "LoadedShard",
    "ShardLoader",
    "iterate_batches",
    "plan_epoch",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedShard:
    inputs: torch.Tensor
    labels: torch.Tensor
    wire_bytes: int
    requests: int
    """HTTP requests this load cost (0 for a cache hit)."""


ShardLoader = Callable[[int], LoadedShard]


@dataclass
class EpochCounters:
    samples: int = 0
    wire_bytes: int = 0
    requests: int = 0
    iterations: int = 0


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
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(inputs, labels)`` batches for one epoch; see the module docstring."""
    pending: deque[tuple[int, Future[LoadedShard]]] = deque()
    order = list(plan.shard_order)
    next_i = 0
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    buffered = 0
    expected = sum(shard_sizes[s] for s in order)
    try:
        while next_i < len(order) or pending:
            while next_i < len(order) and len(pending) < max(1, depth):
                shard = order[next_i]
                pending.append((shard, executor.submit(loader, shard)))
                next_i += 1
            shard, future = pending.popleft()
            loaded = future.result()
            n = len(loaded.labels)
            if n != shard_sizes[shard] or loaded.inputs.shape[0] != n:
                raise DeliveryError(
                    f"shard {shard} delivered {n} samples, the manifest says {shard_sizes[shard]}"
                )
            counters.wire_bytes += loaded.wire_bytes
            counters.requests += loaded.requests
            if permute:
                perm = plan.permutation(shard, n)
                xs.append(loaded.inputs[perm])
                ys.append(loaded.labels[perm])
            else:
                xs.append(loaded.inputs)
                ys.append(loaded.labels)
            buffered += n
            while buffered >= batch_size:
                x, y, xs, ys = _cut(xs, ys, batch_size)
                buffered -= batch_size
                counters.samples += batch_size
                counters.iterations += 1
                yield x, y
        if buffered:
            x, y, xs, ys = _cut(xs, ys, buffered)
            counters.samples += buffered
            counters.iterations += 1
            yield x, y
    finally:
        for _, future in pending:
            future.cancel()
    if counters.samples != expected:
        raise DeliveryError(f"epoch delivered {counters.samples} samples instead of {expected}")


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
