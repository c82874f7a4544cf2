"""One rank's part of a round: compute (or forge) a gradient, aggregate or receive, apply.

Rank 0 runs :meth:`Rounds.aggregate_round` (it computes its own gradient, gathers the fastest
q, applies the rule and sends the update); the other ranks run :meth:`Rounds.worker_round`
(send the gradient, receive the update, apply it and check the replica's checksum). A worker
whose update for the round is already waiting (the round closed without it) skips computing.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from ..robust import Aggregator, BatchBalancer, BatchWeightedAverage, near_memory_limit
from .attacker import Forger
from .channel import AggregatorChannel, WorkerChannel
from .checkpoint import round_seed
from .config import DistributedConfig
from .data import ShardStore
from .errors import ChannelError, ReplicaDivergenceError
from .messages import GradientMessage, UpdateMessage
from .replica import flat_gradient, set_flat_gradient, state_checksum
from .results import EpochStats
from .schedule import EpochSchedule
from .setup import Replica, memory_used

__all__ = ["Rounds"]


class Rounds:
    """The round loop's state on one rank: batch shares, round counter and timings."""

    def __init__(
        self,
        config: DistributedConfig,
        rank: int,
        world: int,
        device: torch.device,
        replica: Replica,
        store: ShardStore,
        rule: Aggregator,
        *,
        forger: Forger | None = None,
        aggregator: AggregatorChannel | None = None,
        channel: WorkerChannel | None = None,
        initial_assignment: tuple[int, ...],
    ) -> None:
        self.config = config
        self.rank = rank
        self.world = world
        self.q = config.workers_q(world)
        self.device = device
        self.replica = replica
        self.store = store
        self.rule = rule
        self.balancer = BatchBalancer(config.train.batch_size, world) if config.balance else None
        self.forger = forger
        self.straggler = config.straggler_rank == rank and config.straggler_delay_s > 0
        self.aggregator = aggregator
        self.channel = channel
        #: Each worker's share of the global batch in the next round.
        self.assignment = initial_assignment
        self.global_round = 0
        self.round_seconds: list[float] = []
        self.round_sizes: list[list[int]] = []

    def compute(self, epoch: int, schedule: EpochSchedule, mine: list[Any]) -> GradientMessage:
        """This rank's gradient (forged if it attacks) on its slice, with what it measured."""
        rep = self.replica
        # Dropout masks and forged gradients: a pure function of the round, so a run resumed
        # from a checkpoint draws what an uninterrupted one would have.
        torch.manual_seed(round_seed(self.config.train.seed, self.rank, self.global_round))
        shards, indices = schedule.samples(mine)
        x, y = self.store.rows(shards, indices)
        started = time.perf_counter()
        x = x.to(self.device, dtype=torch.float32)
        y = y.to(self.device)
        with torch.no_grad():
            h = rep.frozen(x)
        logits = rep.trainable(h)
        loss = nn.functional.cross_entropy(logits, y)
        rep.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gradient: torch.Tensor | None = flat_gradient(rep.params)
        correct = int((logits.detach().argmax(1) == y).sum())
        if self.straggler:
            time.sleep(self.config.straggler_delay_s * len(y))  # a simulated slow device
        if self.forger is not None and gradient is not None:
            gradient = self.forger.forge(gradient, h, y, rep.trainable, rep.params, rep.optimizer)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return GradientMessage(
            round_index=self.global_round,
            epoch=epoch,
            rank=self.rank,
            samples=len(y),
            compute_seconds=time.perf_counter() - started,
            memory_used=memory_used(self.device),
            loss_sum=float(loss.detach()) * len(y),
            correct=correct,
            wire_bytes=self.store.wire_bytes,
            requests=self.store.requests,
            gradient=gradient,
        )

    def apply(self, gradient: torch.Tensor) -> None:
        """One optimizer step with ``gradient`` (the same on every replica)."""
        rep = self.replica
        set_flat_gradient(rep.params, gradient.to(self.device))
        rep.optimizer.step()
        rep.optimizer.zero_grad(set_to_none=True)

    def aggregate_round(
        self,
        epoch: int,
        schedule: EpochSchedule,
        mine: list[Any],
        round_sizes: list[int],
        full_round: bool,
        stats: EpochStats,
    ) -> None:
        """Rank 0: gather the fastest q gradients, aggregate, step, send the update."""
        cfg = self.config
        assert self.aggregator is not None
        started = time.perf_counter()
        own = self.compute(epoch, schedule, mine)
        gathered = self.aggregator.gather(
            self.global_round, self.q, cfg.gather_timeout_s, own, numel=self.replica.numel
        )
        # Fastest q by arrival, then in rank order: the result must not depend on arrival order.
        chosen = sorted(gathered.replies, key=lambda m: m.rank)
        grads = torch.stack([m.gradient.to(self.device) for m in chosen if m.gradient is not None])
        if isinstance(self.rule, BatchWeightedAverage):
            # Only the non-robust weighted average trusts the batch sizes workers report.
            aggregated = self.rule(grads, batch_sizes=[float(m.samples) for m in chosen])
        else:
            aggregated = self.rule(grads)
        self.apply(aggregated)
        if self.balancer is not None and full_round:
            times = [
                gathered.received[r].compute_seconds if r in gathered.received else gathered.seconds
                for r in range(self.world)
            ]
            memory = [
                gathered.received[r].memory_used if r in gathered.received else 0.0
                for r in range(self.world)
            ]
            self.assignment = self.balancer.update(times, near_memory_limit(memory))
        checksum = (
            state_checksum(self.replica.params)
            if self.global_round % cfg.checksum_every == 0
            else None
        )
        self.aggregator.send_update(
            UpdateMessage(self.global_round, self.assignment, checksum, aggregated)
        )
        self.round_seconds.append(time.perf_counter() - started)
        self.round_sizes.append(list(round_sizes))
        stats.replies_used += len(chosen)
        stats.replies_missing += self.world - len(chosen)
        for msg in gathered.received.values():
            stats.loss_sum += msg.loss_sum
            stats.correct += msg.correct
            stats.samples += msg.samples

    def worker_round(
        self, epoch: int, schedule: EpochSchedule, mine: list[Any], stats: EpochStats
    ) -> None:
        """Ranks 1..n-1: send the gradient (unless already late), apply the update, check it."""
        cfg = self.config
        assert self.channel is not None
        update = self.channel.poll_update()
        if update is None:
            msg = self.compute(epoch, schedule, mine)
            if msg.gradient is not None or self.forger is None:
                self.channel.send(msg)
            update = self.channel.recv_update(cfg.update_timeout_s)
        else:
            stats.skipped += 1
        if update.round_index != self.global_round:
            raise ChannelError(
                f"worker {self.rank} expected the update of round {self.global_round}, "
                f"got round {update.round_index}"
            )
        if update.gradient.numel() != self.replica.numel:
            raise ChannelError(
                f"the update of round {update.round_index} has {update.gradient.numel()} "
                f"elements, the trainable tail {self.replica.numel}"
            )
        self.apply(update.gradient)
        if update.checksum is not None:
            mine_sum = state_checksum(self.replica.params)
            if mine_sum != update.checksum:
                raise ReplicaDivergenceError(
                    f"worker {self.rank}'s parameters differ from the aggregator's after round "
                    f"{update.round_index} (checksum {mine_sum:#x} != {update.checksum:#x})"
                )
        if len(update.next_sizes) != self.world or sum(update.next_sizes) != cfg.train.batch_size:
            raise ChannelError(
                f"the aggregator sent batch sizes {list(update.next_sizes)} for "
                f"{self.world} workers and a global batch of {cfg.train.batch_size}"
            )
        self.assignment = tuple(update.next_sizes)
