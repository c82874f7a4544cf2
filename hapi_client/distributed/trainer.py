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

import dataclasses
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
from ..feature_store import DiskFeatureCache
from ..pipeline import ShardLoader, plan_epoch
from ..preparation import cos_batch_cap
from ..robust import even_split
from ..shard_loaders import make_shard_loader
from ..swift_session import SwiftCredentials
from .attacker import forger_for
from .channel import AggregatorChannel, WorkerChannel
from .checkpoint import (
    Checkpoint,
    load_checkpoint,
    load_model_state,
    optimizer_from_parts,
    optimizer_to_parts,
    run_fingerprint,
    save_checkpoint,
)
from .config import DistributedConfig
from .data import ShardStore
from .epoch_end import Evaluator, finish_epoch
from .errors import DistributedConfigError, TrainingCheckpointError
from .rendezvous import channel_address, open_channels
from .results import DistributedEpochMetrics, DistributedResult, EpochStats
from .rounds import Rounds
from .sample_log import SampleLog
from .schedule import (
    EpochSchedule,
    assign_shards,
    remaining_sizes,
    resumed_totals,
    scale_sizes,
)
from .setup import (
    Collectives,
    PreparedModels,
    Replica,
    backend_for,
    credentials_or_env,
    resolve_device,
    setup_replica,
)

__all__ = [
    "DistributedEpochMetrics",
    "DistributedResult",
    "distributed_finetune",
    "for_world",
    "run_sequence",
]

log = logging.getLogger(__name__)


def distributed_finetune(
    config: DistributedConfig,
    *,
    credentials: SwiftCredentials | None = None,
    feature_cache: FeatureCache | None = None,
    models: PreparedModels | None = None,
) -> DistributedResult | None:
    """Run one rank of a multi-worker fine-tuning job; call it in every torchrun worker.

    Initialises torch.distributed from torchrun's environment unless the caller already did.
    Returns the :class:`DistributedResult` on rank 0 (also written to ``config.results_path``)
    and None on the other ranks. Credentials default to ``ST_AUTH``/``ST_USER``/``ST_KEY``.
    ``feature_cache`` lets several runs in one process share extracted features (see
    :func:`run_sequence`); by default each run has its own when ``config.extract.cache_features``
    (on disk in ``config.feature_cache_dir`` if set). ``models`` lets them share the model's
    download and build likewise (:class:`~.setup.PreparedModels`).

    With ``config.checkpoint_dir`` holding a checkpoint, the run resumes from it, in this world:
    ``n = q`` follows the number of workers, ``f`` stays, and the rule's requirement is checked
    again (:class:`DistributedConfigError` if it no longer holds).
    """
    device = resolve_device(config)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(
            backend=backend_for(config, device),
            timeout=timedelta(seconds=config.channel_timeout_s),
        )
    try:
        world = dist.get_world_size()
        resume = load_checkpoint(config.checkpoint_dir) if config.checkpoint_dir else None
        cfg = for_world(config, world, resume)
        caching = cfg.extract.cache_features
        if feature_cache is None and caching:
            feature_cache = _feature_cache(cfg)
        cache = feature_cache if caching else None
        creds = credentials_or_env(credentials)
        result = _Run(cfg, creds, device, cache, resume, models).run()
        if owns_group:
            _leave_together()
        return result
    finally:
        if owns_group:
            dist.destroy_process_group()


def _leave_together() -> None:
    """Meet before the group is torn down, so no rank tears down a group others still use. Once,
    in a run that resumed an already finished checkpoint (every rank leaves at once), a worker
    aborted in C++ on the way out ("terminate called without an active exception"); the cause
    was not pinned down."""
    dist.barrier()


def _feature_cache(config: DistributedConfig) -> FeatureCache:
    """On disk in ``config.feature_cache_dir`` (shared by the node's ranks and their restarts),
    else in memory."""
    if config.feature_cache_dir:
        return DiskFeatureCache(config.feature_cache_dir, max_bytes=config.feature_cache_bytes)
    return FeatureCache()


def for_world(
    config: DistributedConfig, world: int, resume: Checkpoint | None
) -> DistributedConfig:
    """``config`` for ``world`` workers resuming from ``resume``: q resized, the rule checked
    (:class:`DistributedConfigError` naming both worlds), the split the checkpoint trained at."""
    if resume is None:
        config.check_world(world)
        return config
    first = resume.first_world_size
    cfg = config.resized(world, first)
    try:
        cfg.check_world(world)
    except DistributedConfigError as exc:
        if world == first:
            raise
        raise DistributedConfigError(
            f"the job started with {first} workers and now has {world}: {exc}"
        ) from exc
    if isinstance(cfg.extract.split, str):
        # A rule (auto, thesis) may choose another split now; the checkpoint trained at its own.
        cfg = cfg.replace(extract=cfg.extract.replace(split=int(resume.fingerprint["split"])))
    return cfg


def run_sequence(
    configs: Sequence[DistributedConfig], *, credentials: SwiftCredentials | None = None
) -> list[DistributedResult | None]:
    """Run several configurations back to back in this torchrun worker.

    One process group, one feature cache and one prepared model serve them all, so a sweep
    (e.g. one run per aggregation rule) pays the start-up, the model's download and the HAPI
    extraction once: later runs find the features of the same shards, model, split and
    transform in the cache (on disk when the first configuration names a
    ``feature_cache_dir``), and a copy of the model prepared for the same dataset, classes,
    freeze index, input size and seed. All configurations must use the same device and backend.
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
    cache = _feature_cache(first)
    models = PreparedModels()
    try:
        results = [
            distributed_finetune(c, credentials=credentials, feature_cache=cache, models=models)
            for c in configs
        ]
        if owns_group:
            _leave_together()
        return results
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
        resume: Checkpoint | None = None,
        models: PreparedModels | None = None,
    ) -> None:
        self.config = config
        self.models = models
        self.cache = cache
        self.resume = resume
        self.credentials = credentials
        self.device = device
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.collectives = Collectives(device)
        self.history: list[DistributedEpochMetrics] = []
        self.fingerprint: dict[str, object] = {}
        self.first_world = resume.first_world_size if resume is not None else self.world
        self.sample_log: SampleLog | None = None

    def run(self) -> DistributedResult | None:
        cfg = self.config
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        where = channel_address(cfg) if self.rank == 0 else None
        with HapiClient(
            cfg.endpoint,
            self.credentials,
            via=cfg.via,
            bandwidth_bytes_per_s=cfg.bandwidth_bytes_per_s,
            throttle_bytes_per_s=cfg.throttle_bytes_per_s,
        ) as client:
            started = time.perf_counter()
            replica = setup_replica(
                client,
                cfg,
                self.rank,
                self.device,
                self.collectives,
                self.models,
                world_size=self.world,
            )
            self.fingerprint = run_fingerprint(cfg, replica)
            attempt = self._restore(replica)
            if cfg.sample_log_dir:
                resumed = self.resume.global_round if self.resume is not None else 0
                self.sample_log = SampleLog(
                    cfg.sample_log_dir,
                    attempt=attempt,
                    rank=self.rank,
                    world=self.world,
                    resumed_round=resumed,
                )
            aggregator, channel = open_channels(cfg, self.rank, self.world, where)
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
                if self.sample_log is not None:
                    self.sample_log.close()
        if self.rank != 0:
            return None
        return self._result(replica, rounds)

    def _restore(self, replica: Replica) -> int:
        """Load the checkpoint into the replica (every rank) and check that every rank read the
        same one; returns this start's id, rank 0's clock (see :mod:`.sample_log`)."""
        resume = self.resume
        if resume is not None:
            resume.check_fingerprint(self.fingerprint, str(self.config.checkpoint_dir))
            load_model_state(replica.trainable, resume.model)
            optimizer_from_parts(replica.optimizer, resume.optimizer, resume.optimizer_tensors)
            self.history = [DistributedEpochMetrics(**m) for m in resume.history]
        mine = torch.tensor(
            [resume.global_round if resume is not None else -1, time.time_ns()], dtype=torch.int64
        )
        everyone = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(everyone, mine)
        rounds = {int(t[0]) for t in everyone}
        if len(rounds) > 1:
            raise TrainingCheckpointError(
                f"the ranks read different checkpoints from {self.config.checkpoint_dir} (rounds "
                f"{sorted(rounds)}, -1: none): it must be a directory every rank sees"
            )
        if resume is not None:
            log.info(
                "rank %d resumes after round %d (epoch %d, %d rounds into it; written by %d "
                "workers, now %d)",
                self.rank,
                resume.global_round,
                resume.epoch + 1,
                resume.rounds_done,
                resume.world_size,
                self.world,
            )
        return int(everyone[0][1])

    def _save(
        self,
        replica: Replica,
        rounds: Rounds,
        *,
        epoch: int,
        rounds_done: int,
        done: torch.Tensor | None,
        stats: EpochStats | None,
    ) -> None:
        """Rank 0 writes where the run stands (see :mod:`.checkpoint`)."""
        if self.rank != 0 or not self.config.checkpoint_dir:
            return
        optimizer, optimizer_tensors = optimizer_to_parts(replica.optimizer)
        save_checkpoint(
            self.config.checkpoint_dir,
            Checkpoint(
                fingerprint=self.fingerprint,
                epoch=epoch,
                rounds_done=rounds_done,
                global_round=rounds.global_round,
                world_size=self.world,
                first_world_size=self.first_world,
                assignment=list(rounds.assignment),
                stats=dataclasses.asdict(stats) if stats is not None else {},
                history=[dataclasses.asdict(m) for m in self.history],
                round_seconds=rounds.round_seconds,
                round_sizes=rounds.round_sizes,
                optimizer=optimizer,
                model=replica.trainable.state_dict(),
                optimizer_tensors=optimizer_tensors,
                done=done,
            ),
        )

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
            resumed_round=self.resume.global_round if self.resume is not None else None,
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
        b_max = cos_batch_cap(replica.manifest, cfg.extract.b_max, cfg.train.batch_size)

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
            first_epoch = self._resume_rounds(rounds)
            for epoch in range(first_epoch, cfg.train.epochs):
                self._epoch(epoch, sizes, rounds, store, evaluator, depth)
            if self.sample_log is not None:
                self.sample_log.end(store.wire_bytes)
            store.clear()
        return rounds

    def _resume_rounds(self, rounds: Rounds) -> int:
        """Put the round loop where the checkpoint left it; returns the epoch to run first."""
        resume = self.resume
        if resume is None:
            return 0
        rounds.global_round = resume.global_round
        rounds.round_seconds = list(resume.round_seconds)
        rounds.round_sizes = [list(r) for r in resume.round_sizes]
        if resume.world_size == self.world and len(resume.assignment) == self.world:
            rounds.assignment = tuple(resume.assignment)  # LB-BSP's last shares
        return resume.epoch

    def _epoch_start(self, epoch: int, sizes: list[int]) -> tuple[EpochSchedule, int, EpochStats]:
        """The epoch's schedule, the rounds already done and the running sums: fresh, or where
        the checkpoint left them (the remaining samples dealt again in another world)."""
        plan = plan_epoch(len(sizes), self.config.train.seed, epoch)
        resume = self.resume
        if resume is None or resume.epoch != epoch or resume.done is None:
            return EpochSchedule(plan, sizes, assign_shards(sizes, self.world)), 0, EpochStats()
        done = resume.done
        if resume.world_size == self.world:
            owners = assign_shards(sizes, self.world)  # the same streams, resumed in place
        else:
            owners = assign_shards(remaining_sizes(sizes, done), self.world)
        stats = EpochStats(**resume.stats) if self.rank == 0 else EpochStats()
        # Summed over the ranks at the epoch's end against what this start deals.
        stats.assigned = stats.skipped = 0
        return EpochSchedule(plan, sizes, owners, done=done), resume.rounds_done, stats

    def _epoch(
        self,
        epoch: int,
        sizes: list[int],
        rounds: Rounds,
        store: ShardStore,
        evaluator: Evaluator | None,
        depth: int,
    ) -> None:
        cfg = self.config
        start = time.perf_counter()
        schedule, rounds_done, stats = self._epoch_start(epoch, sizes)
        totals = resumed_totals(
            schedule.epoch_samples, rounds_done, schedule.total, cfg.train.batch_size, self.world
        )
        if cfg.max_rounds_per_epoch is not None:
            totals = totals[: max(0, cfg.max_rounds_per_epoch - rounds_done)]
        bytes_before, requests_before = store.wire_bytes, store.requests
        bar = tqdm(
            total=rounds_done + len(totals),
            initial=rounds_done,
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
            if self.sample_log is not None:
                # Before the round: a rank killed after its gradient was used still logged it.
                shards, indices = schedule.samples(mine)
                self.sample_log.round(epoch, rounds.global_round, shards, indices, store.wire_bytes)
            if self.rank == 0:
                full = total == cfg.train.batch_size
                rounds.aggregate_round(epoch, schedule, mine, round_sizes, full, stats)
            else:
                rounds.worker_round(epoch, schedule, mine, stats)
            every = cfg.checkpoint_every
            if every and rounds.global_round % every == 0 and k < len(totals) - 1:
                self._save(
                    rounds.replica,
                    rounds,
                    epoch=epoch,
                    rounds_done=rounds_done + k + 1,
                    done=schedule.done_mask(),
                    stats=stats,
                )
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
            round_count=rounds_done + len(totals),
            schedule=schedule,
            bytes_before=bytes_before,
            requests_before=requests_before,
            stats=stats,
            evaluator=evaluator,
        )
        if metrics is not None:
            self.history.append(metrics)
            log.info("epoch %d: %s", epoch + 1, metrics)
        self._save(rounds.replica, rounds, epoch=epoch + 1, rounds_done=0, done=None, stats=None)
