"""Multi-worker, Byzantine-robust fine-tuning inside a torchrun worker: :func:`distributed_finetune`.

Topology (Garfield's SSMW, one trusted server and n workers): rank 0 is both worker 0 and the
trusted aggregator; ranks 1..n-1 are workers. A dedicated aggregator process would idle while
the workers compute, and on this kind of run (a small trainable tail) the aggregation costs
milliseconds, so rank 0 does both and is excluded from nothing (it may even be told to attack:
only its worker half then lies, the aggregator half stays trusted).

One round ``t``, for the samples the shared :class:`~.schedule.EpochSchedule` gives each worker:

1. every worker computes the gradient of the trainable tail (layers ``[freeze, n)``) on its
   slice, from the features HAPI streamed for its shards; attackers replace it with their
   attack's output; each sends it over the side channel (:mod:`.channel`) with what it
   measured (compute seconds, memory in use, loss, correct predictions);
2. the aggregator takes the fastest ``q`` gradients (``get_gradients(t, q)``) within the
   deadline, orders them by rank (so results do not depend on arrival order), applies the rule
   ``get_aggregator(name, n=q, f=f)`` and its optimizer step, and, with LB-BSP on, feeds the
   measured times to :class:`~hapi_client.robust.BatchBalancer`;
3. it sends every worker the aggregated gradient, the next round's batch sizes and, every
   ``checksum_every`` rounds, a checksum of its parameters; each worker applies the same step
   with the same optimizer, so all replicas stay bit-identical, and checks the checksum.

A worker whose update for round ``t`` is already waiting when round ``t`` starts (the round
closed without it: it was late) skips computing that round and only applies the update, so a
late worker catches up instead of falling further behind.

At each epoch's end (all ranks, over torch.distributed): the BatchNorm statistics of the tail
are broadcast from rank 0 (as DDP's ``broadcast_buffers``), every rank's parameter-and-buffer
checksum is all-gathered and compared, and the per-worker byte and sample counts are summed;
rank 0 then evaluates on the held-out container and records the epoch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import hapi_models
import torch
import torch.distributed as dist
from tqdm import tqdm

from hapi_contract import DatasetManifest

from ..client import HapiClient
from ..feature_cache import FeatureCache
from ..pipeline import ShardLoader, plan_epoch
from ..preparation import cos_batch_cap
from ..robust import even_split
from ..shard_loaders import make_shard_loader
from ..swift_session import SwiftCredentials
from .attacker import forger_for
from .channel import AggregatorChannel, WorkerChannel
from .config import DistributedConfig
from .data import ShardStore
from .epoch_end import Evaluator, finish_epoch
from .errors import DistributedConfigError
from .rendezvous import open_channels
from .results import DistributedEpochMetrics, DistributedResult, EpochStats
from .rounds import Rounds
from .schedule import EpochSchedule, assign_shards, round_totals, scale_sizes
from .setup import (
    Collectives,
    Replica,
    backend_for,
    credentials_or_env,
    resolve_device,
    setup_replica,
)

__all__ = ["DistributedEpochMetrics", "DistributedResult", "distributed_finetune", "run_sequence"]

log = logging.getLogger(__name__)


def distributed_finetune(
    config: DistributedConfig,
    *,
    credentials: SwiftCredentials | None = None,
    feature_cache: FeatureCache | None = None,
) -> DistributedResult | None:
    """Run one rank of a multi-worker fine-tuning job; call it in every torchrun worker.

    Initialises torch.distributed from torchrun's environment unless the caller already did.
    Returns the :class:`DistributedResult` on rank 0 (also written to ``config.results_path``)
    and None on the other ranks. Credentials default to ``ST_AUTH``/``ST_USER``/``ST_KEY``.
    ``feature_cache`` lets several runs in one process share extracted features (see
    :func:`run_sequence`); by default each run has its own when ``config.extract.cache_features``.
    """
    device = resolve_device(config)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(
            backend=backend_for(config, device),
            timeout=timedelta(seconds=config.channel_timeout_s),
        )
    try:
        config.check_world(dist.get_world_size())
        caching = config.extract.cache_features
        if feature_cache is None and caching:
            feature_cache = FeatureCache()
        cache = feature_cache if caching else None
        return _Run(config, credentials_or_env(credentials), device, cache).run()
    finally:
        if owns_group:
            dist.destroy_process_group()


def run_sequence(
    configs: Sequence[DistributedConfig], *, credentials: SwiftCredentials | None = None
) -> list[DistributedResult | None]:
    """Run several configurations back to back in this torchrun worker.

    One process group and one feature cache serve them all, so a sweep (e.g. one run per
    aggregation rule) pays the start-up and the HAPI extraction once: later runs find the
    features of the same shards, model, split and transform in the cache. All configurations
    must use the same device and backend.
    """
    if not configs:
        return []
    first = configs[0]
    if any((c.device, c.backend) != (first.device, first.backend) for c in configs):
        raise DistributedConfigError(
            "every configuration of a sequence must use the same device and backend"
        )
    device = resolve_device(first)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(
            backend=backend_for(first, device),
            timeout=timedelta(seconds=max(c.channel_timeout_s for c in configs)),
        )
    cache = FeatureCache()
    try:
        return [
            distributed_finetune(c, credentials=credentials, feature_cache=cache) for c in configs
        ]
    finally:
        if owns_group:
            dist.destroy_process_group()


class _Run:
    """One rank's run: set up (:mod:`.setup`, :mod:`.rendezvous`), then epochs of rounds
    (:mod:`.rounds`), each closed by :func:`~.epoch_end.finish_epoch`; rank 0 returns the result.
    """

    def __init__(
        self,
        config: DistributedConfig,
        credentials: SwiftCredentials,
        device: torch.device,
        cache: FeatureCache | None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.credentials = credentials
        self.device = device
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.collectives = Collectives(device)
        self.history: list[DistributedEpochMetrics] = []

    def run(self) -> DistributedResult | None:
        cfg = self.config
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        with HapiClient(
            cfg.endpoint,
            self.credentials,
            via=cfg.via,
            bandwidth_bytes_per_s=cfg.bandwidth_bytes_per_s,
            throttle_bytes_per_s=cfg.throttle_bytes_per_s,
        ) as client:
            started = time.perf_counter()
            replica = setup_replica(client, cfg, self.rank, self.device, self.collectives)
            aggregator, channel = open_channels(cfg, self.rank, self.world)
            try:
                log.info(
                    "rank %d ready in %.1f s (split %d, freeze %d, %d trainable parameters)",
                    self.rank,
                    time.perf_counter() - started,
                    replica.split,
                    replica.freeze,
                    replica.numel,
                )
                rounds = self._train(client, replica, aggregator, channel)
            finally:
                if aggregator is not None:
                    aggregator.close()
                if channel is not None:
                    channel.close()
        if self.rank != 0:
            return None
        return self._result(replica, rounds)

    def _result(self, replica: Replica, rounds: Rounds) -> DistributedResult:
        cfg = self.config
        replica.net.eval()
        result = DistributedResult(
            world_size=self.world,
            q=rounds.q,
            f=cfg.f,
            aggregator=cfg.aggregator,
            attack=cfg.attack,
            attackers=list(cfg.attackers),
            mode=cfg.mode,
            split_index=replica.split,
            freeze_index=replica.freeze,
            balance=cfg.balance,
            straggler_rank=cfg.straggler_rank if cfg.straggler_delay_s > 0 else None,
            history=self.history,
            round_seconds=rounds.round_seconds,
            round_sizes=rounds.round_sizes,
            model=replica.net.cpu(),
        )
        if cfg.save_path:
            hapi_models.save_weights(replica.net, cfg.save_path)
        if cfg.results_path:
            Path(cfg.results_path).write_text(json.dumps(result.to_dict(), indent=2))
        return result

    def _train(
        self,
        client: HapiClient,
        replica: Replica,
        aggregator: AggregatorChannel | None,
        channel: WorkerChannel | None,
    ) -> Rounds:
        cfg = self.config
        b_max = cos_batch_cap(replica.manifest, cfg.extract.b_max)

        def loader_for(manifest: DatasetManifest, container: str) -> ShardLoader:
            return make_shard_loader(
                client.swift,
                client.transport,
                manifest,
                container,
                split=replica.split,
                transform=replica.transform,
                stored=replica.stored,
                profile_spec=replica.profile_spec,
                b_max=b_max,
                output_dtype=replica.dtype,
                compression=replica.compression,
                cache=self.cache,
            )

        loader = loader_for(replica.manifest, cfg.container)
        sizes = [s.samples for s in replica.manifest.shards]
        owners = assign_shards(sizes, self.world)
        depth = cfg.prefetch_depth(self.world, replica.manifest.shard_size)
        with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="hapi-dist") as pool:
            store = ShardStore(loader, sizes, pool, capacity=2 * depth + 8)
            rounds = Rounds(
                cfg,
                self.rank,
                self.world,
                self.device,
                replica,
                store,
                cfg.build_rule(self.world),
                forger=forger_for(cfg, self.rank),
                aggregator=aggregator,
                channel=channel,
                initial_assignment=tuple(even_split(cfg.train.batch_size, self.world)),
            )
            evaluator = None
            if replica.eval_manifest is not None and cfg.eval_container:
                eval_loader = loader_for(replica.eval_manifest, cfg.eval_container)
                evaluator = Evaluator(cfg, rounds, eval_loader, pool, depth)
            for epoch in range(cfg.train.epochs):
                self._epoch(epoch, sizes, owners, rounds, store, evaluator, depth)
            store.clear()
        return rounds

    def _epoch(
        self,
        epoch: int,
        sizes: list[int],
        owners: list[list[int]],
        rounds: Rounds,
        store: ShardStore,
        evaluator: Evaluator | None,
        depth: int,
    ) -> None:
        cfg = self.config
        start = time.perf_counter()
        plan = plan_epoch(len(sizes), cfg.train.seed, epoch)
        schedule = EpochSchedule(plan, sizes, owners)
        totals = round_totals(schedule.total, cfg.train.batch_size, self.world)
        if cfg.max_rounds_per_epoch is not None:
            totals = totals[: cfg.max_rounds_per_epoch]
        bytes_before, requests_before = store.wire_bytes, store.requests
        stats = EpochStats()
        bar = tqdm(
            total=len(totals),
            desc=f"{self.world} workers, epoch {epoch + 1}/{cfg.train.epochs}",
            unit="round",
            disable=not (cfg.progress and self.rank == 0),
        )
        forecast_for: tuple[int, ...] | None = None
        for k, total in enumerate(totals):
            if rounds.assignment != forecast_for:
                # Shares changed (or a new epoch): fetch early what will come from other streams.
                forecast_for = rounds.assignment
                ahead = [scale_sizes(rounds.assignment, t) for t in totals[k:]]
                store.prefetch(schedule.foreign_shards(self.rank, ahead))
            round_sizes = scale_sizes(rounds.assignment, total)
            segments = schedule.take(round_sizes)
            mine = segments[self.rank]
            stats.assigned += sum(len(s) for s in mine)
            store.prefetch(schedule.upcoming_shards(self.rank, depth))
            rounds.global_round += 1
            if self.rank == 0:
                full = total == cfg.train.batch_size
                rounds.aggregate_round(epoch, schedule, mine, round_sizes, full, stats)
            else:
                rounds.worker_round(epoch, schedule, mine, stats)
            bar.update(1)
        bar.close()
        metrics = finish_epoch(
            cfg,
            self.rank,
            self.world,
            rounds,
            self.collectives,
            store,
            epoch=epoch,
            start=start,
            round_count=len(totals),
            schedule=schedule,
            bytes_before=bytes_before,
            requests_before=requests_before,
            stats=stats,
            evaluator=evaluator,
        )
        if metrics is not None:
            self.history.append(metrics)
            log.info("epoch %d: %s", epoch + 1, metrics)
