"""The end of an epoch on every rank: replica check, totals, and rank 0's evaluation."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import hapi_models
import torch
import torch.distributed as dist
from torch import nn

from ..errors import DeliveryError
from ..pipeline import EpochCounters, ShardLoader, iterate_batches, plan_epoch
from .config import DistributedConfig
from .data import ShardStore
from .errors import ReplicaDivergenceError
from .replica import state_checksum
from .results import DistributedEpochMetrics, EpochStats
from .rounds import Rounds
from .schedule import EpochSchedule
from .setup import Collectives

__all__ = ["Evaluator", "finish_epoch"]


def finish_epoch(
    config: DistributedConfig,
    rank: int,
    world: int,
    rounds: Rounds,
    collectives: Collectives,
    store: ShardStore,
    *,
    epoch: int,
    start: float,
    round_count: int,
    schedule: EpochSchedule,
    bytes_before: int,
    requests_before: int,
    stats: EpochStats,
    evaluator: Evaluator | None,
) -> DistributedEpochMetrics | None:
    """Sync BatchNorm buffers, check the replicas agree, count; rank 0 evaluates and records.

    The BatchNorm statistics of the tail are broadcast from rank 0 (as DDP's
    ``broadcast_buffers``), every rank's parameter-and-buffer checksum is all-gathered and
    compared, and the per-worker byte and sample counts are summed. Returns the epoch's
    metrics on rank 0, None elsewhere.
    """
    replica = rounds.replica
    for b in replica.buffers:
        collectives.broadcast(b.data)
    checksum = state_checksum([*replica.params, *replica.buffers])
    mine = torch.tensor(
        [
            store.wire_bytes - bytes_before,
            store.requests - requests_before,
            stats.assigned,
            stats.skipped,
            checksum,
        ],
        dtype=torch.int64,
    )
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    table = torch.stack(everyone)
    if bool((table[:, 4] != table[0, 4]).any()):
        differing = [r for r in range(world) if int(table[r, 4]) != int(table[0, 4])]
        raise ReplicaDivergenceError(
            f"after epoch {epoch + 1} the replicas of ranks {differing} differ from rank 0's"
        )
    assigned = int(table[:, 2].sum())
    truncated = config.max_rounds_per_epoch is not None and schedule.remaining > 0
    if not truncated and (assigned != schedule.total or schedule.remaining != 0):
        raise DeliveryError(
            f"epoch {epoch + 1} assigned {assigned} samples to the workers instead of "
            f"{schedule.total}"
        )
    # A resumed epoch's schedule deals only what the checkpoint had left.
    assigned += schedule.epoch_samples - schedule.total
    if rank != 0:
        return None
    seconds = time.perf_counter() - start
    eval_acc = evaluator.accuracy() if evaluator is not None else None
    recent = rounds.round_seconds[-round_count:]
    return DistributedEpochMetrics(
        epoch=epoch + 1,
        loss=stats.loss_sum / stats.samples if stats.samples else float("nan"),
        train_accuracy=stats.correct / stats.samples if stats.samples else float("nan"),
        eval_accuracy=eval_acc,
        seconds=seconds,
        samples=assigned,
        rounds=round_count,
        replies_used=stats.replies_used,
        replies_missing=stats.replies_missing,
        skipped_rounds=int(table[:, 3].sum()),
        bytes_received=int(table[:, 0].sum()),
        requests=int(table[:, 1].sum()),
        mean_round_seconds=sum(recent) / max(1, len(recent)),
        batch_sizes=list(rounds.assignment),
    )


class Evaluator:
    """Rank 0's accuracy on the held-out container, through the same split as training."""

    def __init__(
        self,
        config: DistributedConfig,
        rounds: Rounds,
        loader: ShardLoader,
        pool: ThreadPoolExecutor,
        prefetch: int,
    ) -> None:
        self.config = config
        self.rounds = rounds
        self.loader = loader
        self.pool = pool
        self.prefetch = prefetch

    def accuracy(self) -> float | None:
        replica = self.rounds.replica
        if replica.eval_manifest is None:
            return None
        cfg = self.config
        hapi_models.set_modes(replica.net, replica.freeze, training=False)
        rest = nn.Sequential(*replica.net.layers[replica.split :])
        shards = replica.eval_manifest.shards
        plan = plan_epoch(len(shards), 0, 0, shuffle=False)
        batches = iterate_batches(
            plan,
            [s.samples for s in shards],
            self.loader,
            cfg.train.batch_size,
            self.pool,
            self.prefetch,
            EpochCounters(),
            permute=False,
        )
        accuracy = hapi_models.evaluate(rest, batches, self.rounds.device)
        hapi_models.set_modes(replica.net, replica.freeze, training=True)
        return accuracy
