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
import os
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import hapi_models
import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from hapi_contract import Compression, DatasetManifest, OutputDtype

from ..client import HapiClient
from ..errors import DeliveryError
from ..feature_cache import FeatureCache
from ..pipeline import EpochCounters, iterate_batches, plan_epoch
from ..preparation import cos_batch_cap, decide_split, prepare_model
from ..robust import (
    ALittleIsEnough,
    Attack,
    BatchBalancer,
    BatchWeightedAverage,
    FallOfEmpires,
    even_split,
    get_attack,
    near_memory_limit,
)
from ..shard_loaders import make_shard_loader
from ..swift_session import DEFAULT_AUTH_URL, SwiftCredentials
from .channel import AggregatorChannel, WorkerChannel
from .config import DistributedConfig
from .data import ShardStore
from .errors import ChannelError, DistributedConfigError, ReplicaDivergenceError
from .messages import TOKEN_BYTES, GradientMessage, UpdateMessage
from .replica import flat_gradient, set_flat_gradient, state_checksum, trainable_parameters
from .schedule import EpochSchedule, assign_shards, round_totals, scale_sizes

__all__ = ["DistributedEpochMetrics", "DistributedResult", "distributed_finetune", "run_sequence"]

log = logging.getLogger(__name__)

_ADDRESS_BYTES = 256
#: Micro-batches an attacker splits its slice into to estimate the honest gradients' spread.
_ATTACK_MICRO_BATCHES = 4


@dataclass
class DistributedEpochMetrics:
    """One epoch of a multi-worker run, as rank 0 saw it (bytes and requests of all workers)."""

    epoch: int
    loss: float
    train_accuracy: float
    eval_accuracy: float | None
    seconds: float
    samples: int
    rounds: int
    replies_used: int
    replies_missing: int
    skipped_rounds: int
    bytes_received: int
    requests: int
    mean_round_seconds: float
    batch_sizes: list[int]


@dataclass
class DistributedResult:
    """What :func:`distributed_finetune` returns on rank 0 (and :func:`~.launcher.launch` reads back)."""

    world_size: int
    q: int
    f: int
    aggregator: str
    attack: str | None
    attackers: list[int]
    mode: str
    split_index: int
    freeze_index: int
    balance: bool
    straggler_rank: int | None
    history: list[DistributedEpochMetrics]
    round_seconds: list[float] = field(default_factory=list)
    round_sizes: list[list[int]] = field(default_factory=list)
    model: hapi_models.SplittableModel | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(replace(self, model=None)).items() if k != "model"}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DistributedResult:
        values = dict(data)
        values["history"] = [DistributedEpochMetrics(**m) for m in values.get("history", [])]
        values.pop("model", None)
        return cls(**values)

    @property
    def final_eval_accuracy(self) -> float | None:
        return self.history[-1].eval_accuracy if self.history else None


def _credentials(given: SwiftCredentials | None) -> SwiftCredentials:
    if given is not None:
        return given
    return SwiftCredentials(
        os.environ.get("ST_AUTH") or DEFAULT_AUTH_URL,
        os.environ.get("ST_USER") or "test:tester",
        os.environ.get("ST_KEY") or "testing",
    )


def _resolve_device(config: DistributedConfig) -> torch.device:
    if config.device == "cpu":
        return torch.device("cpu")
    if config.device.startswith("cuda:"):
        return torch.device(config.device)
    if not torch.cuda.is_available():
        if config.device == "cuda":
            raise DistributedConfigError("device 'cuda' was asked for but CUDA is not available")
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device("cuda", local % torch.cuda.device_count())


def _backend(config: DistributedConfig, device: torch.device) -> str:
    """gloo on CPU; on GPU gloo for host tensors plus NCCL for device tensors."""
    if config.backend == "gloo" or device.type != "cuda":
        if config.backend == "nccl":
            raise DistributedConfigError("backend 'nccl' needs a CUDA device")
        return "gloo"
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if config.backend == "auto" and torch.cuda.device_count() < local_world:
        # NCCL refuses two ranks on one GPU; fall back to gloo through host memory.
        return "gloo"
    return "cpu:gloo,cuda:nccl"


def _memory_used(device: torch.device) -> float:
    """Fraction of the device's memory in use (host memory on CPU), for LB-BSP's memory guard."""
    if device.type == "cuda":
        free, capacity = torch.cuda.mem_get_info(device)
        return 1.0 - free / capacity if capacity else 0.0
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        total = float(info["MemTotal"].split()[0])
        available = float(info["MemAvailable"].split()[0])
        return 1.0 - available / total if total else 0.0
    except (OSError, KeyError, ValueError):
        return 0.0


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
    :func:`run_sequence`); by default each run has its own when ``config.cache_features``.
    """
    device = _resolve_device(config)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend=_backend(config, device),
                                timeout=timedelta(seconds=config.channel_timeout_s))
    try:
        config.check_world(dist.get_world_size())
        if feature_cache is None and config.cache_features:
            feature_cache = FeatureCache()
        return _Run(config, _credentials(credentials), device, feature_cache if config.cache_features else None).run()
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
        raise DistributedConfigError("every configuration of a sequence must use the same device and backend")
    device = _resolve_device(first)
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend=_backend(first, device),
                                timeout=timedelta(seconds=max(c.channel_timeout_s for c in configs)))
    cache = FeatureCache()
    try:
        return [distributed_finetune(c, credentials=credentials, feature_cache=cache) for c in configs]
    finally:
        if owns_group:
            dist.destroy_process_group()


class _Run:
    """The state of one rank (kept out of the public signature)."""

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
        self.q = config.workers_q(self.world)
        self.device_collectives = device.type == "cuda" and "nccl" in str(dist.get_backend())
        self.attack: Attack | None = None
        if config.attack is not None and self.rank in config.attackers:
            self.attack = get_attack(config.attack, n_byzantine=1, seed=config.seed * 7919 + self.rank,
                                     **config.attack_params)
        self.straggler = config.straggler_rank == self.rank and config.straggler_delay_s > 0
        self.aggregator: AggregatorChannel | None = None
        self.channel: WorkerChannel | None = None

    # -- setup -------------------------------------------------------------------------------

    def _setup_model(self, client: HapiClient) -> None:
        cfg = self.config
        prepared = prepare_model(client, cfg.model, cfg.container, num_classes=cfg.num_classes,
                                 freeze_index=cfg.freeze_index, image_size=cfg.image_size, seed=cfg.seed)
        self.stored, self.manifest, self.transform = prepared.stored, prepared.manifest, prepared.transform
        self.eval_manifest: DatasetManifest | None = None
        if self.rank == 0 and cfg.eval_container:
            self.eval_manifest = client.manifest(cfg.eval_container)
        net, freeze = prepared.net, prepared.freeze_index
        self.freeze = freeze
        self.dtype = OutputDtype(cfg.output_dtype)
        self.compression = Compression(cfg.compression)
        self.profile_spec = prepared.profile_spec
        self.split = self._agree_on_split(client, prepared.profile)
        net = net.to(self.device)
        hapi_models.prepare_for_finetuning(net, freeze)
        self.net = net
        self.frozen = nn.Sequential(*net.layers[self.split:freeze])
        self.trainable = net.tail(freeze)
        self.params = trainable_parameters(net)
        self.numel = sum(p.numel() for p in self.params)
        self.buffers = list(self.trainable.buffers())
        self.optimizer = cfg.optimizer_config().build(self.params)
        for t in [*self.params, *self.buffers]:
            self._broadcast(t.data)
        # Dropout differs per worker on purpose; the model itself stays identical.
        torch.manual_seed(cfg.seed * 1000 + self.rank)

    def _agree_on_split(self, client: HapiClient, prof: hapi_models.ModelProfile) -> int:
        """Rank 0 decides the split (from its measured bandwidth) and every rank uses it."""
        cfg = self.config
        choice = torch.zeros(1, dtype=torch.int64)
        if self.rank == 0:
            if cfg.mode == "baseline":
                choice[0] = 0
            else:
                if cfg.split == "auto" and client.bandwidth.bytes_per_s is None:
                    client.swift.probe(cfg.container, self.manifest.shards[0].name)
                decision = decide_split(prof, self.manifest, cfg.batch_size, client.bandwidth.bytes_per_s,
                                        self.freeze, self.dtype, cfg.split)
                log.info("split %d: %s", decision.split_index, decision.reason)
                choice[0] = decision.split_index
        dist.broadcast(choice, src=0)
        return int(choice[0])

    def _broadcast(self, t: torch.Tensor) -> None:
        if self.device_collectives or t.device.type == "cpu":
            dist.broadcast(t, src=0)
            return
        host = t.detach().cpu()
        dist.broadcast(host, src=0)
        t.copy_(host)

    def _open_channel(self) -> None:
        cfg = self.config
        buf = torch.zeros(_ADDRESS_BYTES + TOKEN_BYTES, dtype=torch.uint8)
        if self.rank == 0:
            host = cfg.channel_host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
            token = secrets.token_bytes(TOKEN_BYTES)
            self.aggregator = AggregatorChannel(self.world, token, host=host, io_timeout_s=cfg.channel_timeout_s)
            bound_host, port = self.aggregator.address
            address = f"{bound_host}:{port}".encode()
            buf[: len(address)] = torch.frombuffer(bytearray(address), dtype=torch.uint8)
            buf[_ADDRESS_BYTES:] = torch.frombuffer(bytearray(token), dtype=torch.uint8)
        dist.broadcast(buf, src=0)
        if self.rank == 0:
            assert self.aggregator is not None
            self.aggregator.accept(cfg.channel_timeout_s)
            return
        raw = bytes(buf[:_ADDRESS_BYTES].tolist()).rstrip(b"\0").decode()
        host, _, port_text = raw.rpartition(":")
        token = bytes(buf[_ADDRESS_BYTES:].tolist())
        self.channel = WorkerChannel((host, int(port_text)), self.rank, self.world, token,
                                     connect_timeout_s=cfg.channel_timeout_s, io_timeout_s=cfg.channel_timeout_s)

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> DistributedResult | None:
        cfg = self.config
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        with HapiClient(cfg.endpoint, self.credentials, via=cfg.via,  # type: ignore[arg-type]
                        bandwidth_bytes_per_s=cfg.bandwidth_bytes_per_s,
                        throttle_bytes_per_s=cfg.throttle_bytes_per_s) as client:
            started = time.perf_counter()
            self._setup_model(client)
            try:
                self._open_channel()
                log.info("rank %d ready in %.1f s (split %d, freeze %d, %d trainable parameters)", self.rank,
                         time.perf_counter() - started, self.split, self.freeze, self.numel)
                self._train(client)
            finally:
                if self.aggregator is not None:
                    self.aggregator.close()
                if self.channel is not None:
                    self.channel.close()
        if self.rank != 0:
            return None
        self.net.eval()
        result = DistributedResult(
            world_size=self.world, q=self.q, f=cfg.f, aggregator=cfg.aggregator, attack=cfg.attack,
            attackers=list(cfg.attackers), mode=cfg.mode, split_index=self.split, freeze_index=self.freeze,
            balance=cfg.balance, straggler_rank=cfg.straggler_rank if cfg.straggler_delay_s > 0 else None,
            history=self.history, round_seconds=self.round_seconds, round_sizes=self.round_sizes,
            model=self.net.cpu(),
        )
        if cfg.save_path:
            hapi_models.save_weights(self.net, cfg.save_path)
        if cfg.results_path:
            Path(cfg.results_path).write_text(json.dumps(result.to_dict(), indent=2))
        return result

    def _train(self, client: HapiClient) -> None:
        cfg = self.config
        self.rule = cfg.build_rule(self.world)
        # Only the non-robust weighted average trusts the batch sizes workers report.
        self.weighted = isinstance(self.rule, BatchWeightedAverage)
        self.balancer = BatchBalancer(cfg.batch_size, self.world) if cfg.balance else None
        self.assignment: tuple[int, ...] = tuple(even_split(cfg.batch_size, self.world))
        cache = self.cache
        b_max = cos_batch_cap(self.manifest, cfg.b_max)
        loader = make_shard_loader(
            client, self.manifest, cfg.container, split=self.split, transform=self.transform,
            stored=self.stored, profile_spec=self.profile_spec, b_max=b_max, output_dtype=self.dtype,
            compression=self.compression, cache=cache)
        self.eval_loader = None
        if self.eval_manifest is not None and cfg.eval_container:
            self.eval_loader = make_shard_loader(
                client, self.eval_manifest, cfg.eval_container, split=self.split, transform=self.transform,
                stored=self.stored, profile_spec=self.profile_spec, b_max=b_max, output_dtype=self.dtype,
                compression=self.compression, cache=cache)
        sizes = [s.samples for s in self.manifest.shards]
        self.owners = assign_shards(sizes, self.world)
        self.history: list[DistributedEpochMetrics] = []
        self.round_seconds: list[float] = []
        self.round_sizes: list[list[int]] = []
        self.global_round = 0
        with ThreadPoolExecutor(max_workers=cfg.prefetch, thread_name_prefix="hapi-dist") as pool:
            self.pool = pool
            self.store = ShardStore(loader, sizes, pool, capacity=2 * cfg.prefetch + 8)
            for epoch in range(cfg.epochs):
                self._epoch(epoch, sizes)
            self.store.clear()

    def _epoch(self, epoch: int, sizes: list[int]) -> None:
        cfg = self.config
        start = time.perf_counter()
        plan = plan_epoch(len(sizes), cfg.seed, epoch)
        schedule = EpochSchedule(plan, sizes, self.owners)
        totals = round_totals(schedule.total, cfg.batch_size, self.world)
        if cfg.max_rounds_per_epoch is not None:
            totals = totals[: cfg.max_rounds_per_epoch]
        bytes_before, requests_before = self.store.wire_bytes, self.store.requests
        stats = _EpochStats()
        bar = tqdm(total=len(totals), desc=f"{self.world} workers, epoch {epoch + 1}/{cfg.epochs}", unit="round",
                   disable=not (cfg.progress and self.rank == 0))
        forecast_for: tuple[int, ...] | None = None
        for k, total in enumerate(totals):
            if self.assignment != forecast_for:
                # Shares changed (or a new epoch): fetch early what will come from other streams.
                forecast_for = self.assignment
                ahead = [scale_sizes(self.assignment, t) for t in totals[k:]]
                self.store.prefetch(schedule.foreign_shards(self.rank, ahead))
            round_sizes = scale_sizes(self.assignment, total)
            segments = schedule.take(round_sizes)
            mine = segments[self.rank]
            stats.assigned += sum(len(s) for s in mine)
            self.store.prefetch(schedule.upcoming_shards(self.rank, cfg.prefetch))
            self.global_round += 1
            if self.rank == 0:
                self._aggregate_round(epoch, schedule, mine, round_sizes, total == cfg.batch_size, stats)
            else:
                self._worker_round(epoch, schedule, mine, stats)
            bar.update(1)
        bar.close()
        self._end_epoch(epoch, start, len(totals), schedule, bytes_before, requests_before, stats)

    def _compute(self, epoch: int, schedule: EpochSchedule, mine: list[Any]) -> GradientMessage:
        shards, indices = schedule.samples(mine)
        x, y = self.store.rows(shards, indices)
        started = time.perf_counter()
        x = x.to(self.device, dtype=torch.float32)
        y = y.to(self.device)
        with torch.no_grad():
            h = self.frozen(x)
        logits = self.trainable(h)
        loss = nn.functional.cross_entropy(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gradient: torch.Tensor | None = flat_gradient(self.params)
        correct = int((logits.detach().argmax(1) == y).sum())
        if self.straggler:
            time.sleep(self.config.straggler_delay_s * len(y))  # a simulated slow device
        if self.attack is not None:
            gradient = self._forge(gradient, h, y)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return GradientMessage(
            round_index=self.global_round, epoch=epoch, rank=self.rank, samples=len(y),
            compute_seconds=time.perf_counter() - started, memory_used=_memory_used(self.device),
            loss_sum=float(loss.detach()) * len(y), correct=correct, wire_bytes=self.store.wire_bytes,
            requests=self.store.requests, gradient=gradient,
        )

    def _forge(self, gradient: torch.Tensor | None, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """The attacker's reply; attacks that need the honest spread see micro-batch gradients.

        A worker only knows its own data. "A Little Is Enough" and "Fall of Empires" need the
        mean (and spread) of honest gradients: as in Baruch et al., the attacker estimates them
        from its own samples, here the gradients of up to 4 micro-batches of its slice.
        """
        assert self.attack is not None and gradient is not None
        honest = [gradient]
        if isinstance(self.attack, ALittleIsEnough | FallOfEmpires) and len(y) >= 2:
            honest = []
            for chunk in torch.arange(len(y)).tensor_split(min(_ATTACK_MICRO_BATCHES, len(y))):
                self.optimizer.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(self.trainable(h[chunk]), y[chunk]).backward()
                honest.append(flat_gradient(self.params))
            self.optimizer.zero_grad(set_to_none=True)
        forged = self.attack(honest)
        return forged[0] if forged else None

    def _apply(self, gradient: torch.Tensor) -> None:
        set_flat_gradient(self.params, gradient.to(self.device))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _aggregate_round(
        self,
        epoch: int,
        schedule: EpochSchedule,
        mine: list[Any],
        round_sizes: list[int],
        full_round: bool,
        stats: _EpochStats,
    ) -> None:
        cfg = self.config
        assert self.aggregator is not None
        started = time.perf_counter()
        own = self._compute(epoch, schedule, mine)
        gathered = self.aggregator.gather(self.global_round, self.q, cfg.gather_timeout_s, own, numel=self.numel)
        # Fastest q by arrival, then in rank order: the result must not depend on arrival order.
        chosen = sorted(gathered.replies, key=lambda m: m.rank)
        grads = torch.stack([m.gradient.to(self.device) for m in chosen if m.gradient is not None])
        if self.weighted:
            aggregated = self.rule(grads, batch_sizes=[float(m.samples) for m in chosen])
        else:
            aggregated = self.rule(grads)
        self._apply(aggregated)
        if self.balancer is not None and full_round:
            times = [gathered.received[r].compute_seconds if r in gathered.received else gathered.seconds
                     for r in range(self.world)]
            memory = [gathered.received[r].memory_used if r in gathered.received else 0.0
                      for r in range(self.world)]
            self.assignment = self.balancer.update(times, near_memory_limit(memory))
        checksum = state_checksum(self.params) if self.global_round % cfg.checksum_every == 0 else None
        self.aggregator.send_update(UpdateMessage(self.global_round, self.assignment, checksum, aggregated))
        self.round_seconds.append(time.perf_counter() - started)
        self.round_sizes.append(list(round_sizes))
        stats.replies_used += len(chosen)
        stats.replies_missing += self.world - len(chosen)
        for msg in gathered.received.values():
            stats.loss_sum += msg.loss_sum
            stats.correct += msg.correct
            stats.samples += msg.samples

    def _worker_round(self, epoch: int, schedule: EpochSchedule, mine: list[Any], stats: _EpochStats) -> None:
        cfg = self.config
        assert self.channel is not None
        update = self.channel.poll_update()
        if update is None:
            msg = self._compute(epoch, schedule, mine)
            if msg.gradient is not None or self.attack is None:
                self.channel.send(msg)
            update = self.channel.recv_update(cfg.channel_timeout_s)
        else:
            stats.skipped += 1
        if update.round_index != self.global_round:
            raise ChannelError(f"worker {self.rank} expected the update of round {self.global_round}, "
                               f"got round {update.round_index}")
        if update.gradient.numel() != self.numel:
            raise ChannelError(f"the update of round {update.round_index} has {update.gradient.numel()} "
                               f"elements, the trainable tail {self.numel}")
        self._apply(update.gradient)
        if update.checksum is not None:
            mine_sum = state_checksum(self.params)
            if mine_sum != update.checksum:
                raise ReplicaDivergenceError(
                    f"worker {self.rank}'s parameters differ from the aggregator's after round "
                    f"{update.round_index} (checksum {mine_sum:#x} != {update.checksum:#x})")
        if len(update.next_sizes) != self.world or sum(update.next_sizes) != cfg.batch_size:
            raise ChannelError(f"the aggregator sent batch sizes {list(update.next_sizes)} for "
                               f"{self.world} workers and a global batch of {cfg.batch_size}")
        self.assignment = tuple(update.next_sizes)

    def _end_epoch(
        self,
        epoch: int,
        start: float,
        rounds: int,
        schedule: EpochSchedule,
        bytes_before: int,
        requests_before: int,
        stats: _EpochStats,
    ) -> None:
        cfg = self.config
        for b in self.buffers:
            self._broadcast(b.data)
        checksum = state_checksum([*self.params, *self.buffers])
        mine = torch.tensor([self.store.wire_bytes - bytes_before, self.store.requests - requests_before,
                             stats.assigned, stats.skipped, checksum], dtype=torch.int64)
        everyone = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(everyone, mine)
        table = torch.stack(everyone)
        if bool((table[:, 4] != table[0, 4]).any()):
            differing = [r for r in range(self.world) if int(table[r, 4]) != int(table[0, 4])]
            raise ReplicaDivergenceError(f"after epoch {epoch + 1} the replicas of ranks {differing} differ "
                                         "from rank 0's")
        assigned = int(table[:, 2].sum())
        truncated = cfg.max_rounds_per_epoch is not None and schedule.remaining > 0
        if not truncated and (assigned != schedule.total or schedule.remaining != 0):
            raise DeliveryError(f"epoch {epoch + 1} assigned {assigned} samples to the workers instead of "
                                f"{schedule.total}")
        if self.rank != 0:
            return
        seconds = time.perf_counter() - start
        eval_acc = self._evaluate()
        recent = self.round_seconds[-rounds:]
        self.history.append(DistributedEpochMetrics(
            epoch=epoch + 1,
            loss=stats.loss_sum / stats.samples if stats.samples else float("nan"),
            train_accuracy=stats.correct / stats.samples if stats.samples else float("nan"),
            eval_accuracy=eval_acc, seconds=seconds, samples=assigned, rounds=rounds,
            replies_used=stats.replies_used, replies_missing=stats.replies_missing,
            skipped_rounds=int(table[:, 3].sum()), bytes_received=int(table[:, 0].sum()),
            requests=int(table[:, 1].sum()), mean_round_seconds=sum(recent) / max(1, len(recent)),
            batch_sizes=list(self.assignment),
        ))
        log.info("epoch %d: %s", epoch + 1, self.history[-1])

    def _evaluate(self) -> float | None:
        if self.eval_manifest is None or self.eval_loader is None:
            return None
        cfg = self.config
        hapi_models.set_modes(self.net, self.freeze, training=False)
        rest = nn.Sequential(*self.net.layers[self.split:])
        plan = plan_epoch(len(self.eval_manifest.shards), 0, 0, shuffle=False)
        batches = iterate_batches(plan, [s.samples for s in self.eval_manifest.shards], self.eval_loader,
                                  cfg.batch_size, self.pool, cfg.prefetch, EpochCounters(), permute=False)
        accuracy = hapi_models.evaluate(rest, batches, self.device)
        hapi_models.set_modes(self.net, self.freeze, training=True)
        return accuracy


@dataclass
class _EpochStats:
    assigned: int = 0
    skipped: int = 0
    replies_used: int = 0
    replies_missing: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    samples: int = 0
