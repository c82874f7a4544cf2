"""Settings of a multi-worker run: one JSON-serialisable value object shared by every rank.

The launcher writes it to a file that each torchrun worker reads, so every rank runs with
exactly the same settings; credentials never go into it (they travel in ``ST_AUTH``,
``ST_USER``, ``ST_KEY``).

The fine-tuning settings are the library's own option objects, :class:`~hapi_client.TrainOptions`
and :class:`~hapi_client.ExtractOptions` (each checks itself when built); this module adds only
what several workers need: the world's rules (aggregator, ``f``, ``q``, attack), the side
channel, the device and backend, and the simulated heterogeneity.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from ..client import DEFAULT_ENDPOINT
from ..errors import ConfigurationError
from ..options import ExtractOptions, TrainOptions, prefetch_depth
from ..robust import RobustAggregationError, get_aggregator, get_attack
from .errors import DistributedConfigError

__all__ = ["DistributedConfig"]

Mode = Literal["hapi", "baseline"]
Via = Literal["hapi", "swift"]
_MODES: tuple[str, ...] = get_args(Mode)
_VIAS: tuple[str, ...] = get_args(Via)
_DEVICES = ("auto", "cpu", "cuda")
_BACKENDS = ("auto", "gloo", "nccl")
#: A host name or an IPv4 address (IPv6 ones are checked by ipaddress); short enough to fit
#: ``host:port`` in the channel's broadcast.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_OPTIONS: dict[str, type[TrainOptions] | type[ExtractOptions]] = {
    "train": TrainOptions,
    "extract": ExtractOptions,
}


@dataclass(frozen=True)
class DistributedConfig:
    """Everything a multi-worker fine-tuning run needs, except the world size and credentials.

    Data and model (as :func:`hapi_client.run_finetune`): ``model`` is a descriptor such as
    ``models/efficientnet_lite0``; ``mode`` is ``hapi`` or ``baseline``; ``train`` and
    ``extract`` are the shared option objects, where ``train.batch_size`` is the *global* batch
    of one round, split over the workers (evenly, or by LB-BSP when ``balance``), and
    ``extract.prefetch`` is each worker's read-ahead in shards (None: enough for the worker's
    even share of one batch, at least 2; see :meth:`prefetch_depth`).

    Robustness: ``aggregator`` (a :func:`hapi_client.robust.get_aggregator` name) is built for
    ``n = q`` inputs (``q`` defaults to the number of workers) and ``f`` declared Byzantine
    ones; the aggregator waits ``gather_timeout_s`` at most for the fastest ``q`` gradients.
    ``attackers`` are the ranks that replace their gradient with ``attack``'s output (the
    declared ``f`` is separate from ``len(attackers)``).

    Heterogeneity: ``balance`` turns LB-BSP on; ``straggler_rank`` sleeps
    ``straggler_delay_s`` seconds per sample of its batch (a simulated slow GPU).

    Side channel (:mod:`.addresses`): ``channel_bind`` is where rank 0 listens (``0.0.0.0`` or
    ``::`` for all interfaces; None: 127.0.0.1 when every rank runs on one host, else all
    interfaces) and ``channel_advertise`` the host name or address the workers connect to (None:
    the bind address if one is given, else torch's ``MASTER_ADDR``, a name each worker resolves
    for itself). Rank 0's node may set them with ``HAPI_CHANNEL_BIND``/``HAPI_CHANNEL_ADVERTISE``
    instead.

    Timeouts, one rule: rank 0 waits ``gather_timeout_s`` for the gradients of a round; a
    worker waits for the round's update :attr:`update_timeout_s` = ``gather_timeout_s +
    update_margin_s`` (the margin covers what rank 0 does around its gather: its own gradient,
    the aggregation, a checkpoint, sending the update), and every channel socket declares a
    silent peer dead within :attr:`keepalive_s` = ``gather_timeout_s`` (TCP keepalive,
    :class:`~hapi_client.distributed.channel.Keepalive`). So after a link cut every rank fails
    within about the gather timeout, and a restarted job (torchrun) recovers after that plus its
    rendezvous. ``channel_timeout_s`` bounds only the rendezvous: the process group's start,
    the workers' connection to the channel and rank 0's wait for them.

    Restarts (:mod:`.checkpoint`): with ``checkpoint_dir`` (a directory every rank sees) rank 0
    writes a checkpoint at every epoch's end and, with ``checkpoint_every``, every that many
    rounds; a job started again (a torchrun restart, maybe with another number of workers)
    resumes from it. ``feature_cache_dir`` keeps the extracted features on local disk
    (:class:`~hapi_client.DiskFeatureCache`, at most ``feature_cache_bytes``), so a restarted
    worker does not fetch them again. ``sample_log_dir``: every rank appends the samples it was
    dealt each round, as JSON lines, to a file there (an audit of exactly-once delivery).
    """

    model: str
    container: str
    train: TrainOptions = field(default_factory=TrainOptions)
    extract: ExtractOptions = field(default_factory=ExtractOptions)
    endpoint: str = DEFAULT_ENDPOINT
    via: Via = "hapi"
    eval_container: str | None = None
    num_classes: int | None = None
    mode: Mode = "hapi"
    bandwidth_bytes_per_s: float | None = None
    throttle_bytes_per_s: float | None = None
    device: str = "auto"
    backend: str = "auto"
    threads: int | None = 1
    aggregator: str = "average"
    aggregator_params: dict[str, Any] = field(default_factory=dict)
    f: int = 0
    q: int | None = None
    gather_timeout_s: float = 120.0
    attack: str | None = None
    attack_params: dict[str, Any] = field(default_factory=dict)
    attackers: tuple[int, ...] = ()
    balance: bool = False
    straggler_rank: int | None = None
    straggler_delay_s: float = 0.0
    checksum_every: int = 50
    max_rounds_per_epoch: int | None = None
    channel_bind: str | None = None
    channel_advertise: str | None = None
    channel_timeout_s: float = 600.0
    update_margin_s: float = 30.0
    results_path: str | None = None
    save_path: str | None = None
    progress: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    feature_cache_dir: str | None = None
    feature_cache_bytes: int = 20 * 2**30
    sample_log_dir: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "attackers", tuple(int(r) for r in self.attackers))
        problems = list(self._static_problems())
        if problems:
            raise DistributedConfigError("; ".join(problems))

    def _static_problems(self) -> list[str]:
        out = []
        for name, kind in _OPTIONS.items():
            if not isinstance(getattr(self, name), kind):
                out.append(
                    f"{name} must be a hapi_client.{kind.__name__}, got {getattr(self, name)!r}"
                )
        if "/" not in self.model:
            out.append(f"model must look like 'models/efficientnet_lite0', got {self.model!r}")
        if self.mode not in _MODES:
            out.append(
                f"mode must be one of {', '.join(_MODES)} for multi-worker runs, got {self.mode!r}"
            )
        if self.via not in _VIAS:
            out.append(f"via must be one of {', '.join(_VIAS)}, got {self.via!r}")
        if self.device not in _DEVICES and not self.device.startswith("cuda:"):
            out.append(
                f"device must be one of {', '.join(_DEVICES)} or cuda:N, got {self.device!r}"
            )
        if self.backend not in _BACKENDS:
            out.append(f"backend must be one of {', '.join(_BACKENDS)}, got {self.backend!r}")
        if self.checksum_every < 1:
            out.append(f"checksum_every must be >= 1, got {self.checksum_every}")
        if self.threads is not None and self.threads < 1:
            out.append(f"threads must be >= 1, got {self.threads}")
        if self.f < 0:
            out.append(f"f must be >= 0, got {self.f}")
        if self.q is not None and self.q < 1:
            out.append(f"q must be >= 1, got {self.q}")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            out.append(f"checkpoint_every must be >= 1 round, got {self.checkpoint_every}")
        if self.checkpoint_every is not None and not self.checkpoint_dir:
            out.append("checkpoint_every needs checkpoint_dir")
        if self.feature_cache_bytes < 1:
            out.append(f"feature_cache_bytes must be >= 1, got {self.feature_cache_bytes}")
        if self.feature_cache_dir and not self.extract.cache_features:
            out.append("feature_cache_dir needs extract.cache_features")
        if self.max_rounds_per_epoch is not None and self.max_rounds_per_epoch < 1:
            out.append(f"max_rounds_per_epoch must be >= 1, got {self.max_rounds_per_epoch}")
        for name in ("bandwidth_bytes_per_s", "throttle_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                out.append(f"{name} must be a positive number, got {value}")
        for name in ("gather_timeout_s", "channel_timeout_s", "update_margin_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                out.append(f"{name} must be a positive number of seconds, got {value}")
        if not (math.isfinite(self.straggler_delay_s) and self.straggler_delay_s >= 0):
            out.append(f"straggler_delay_s must be >= 0, got {self.straggler_delay_s}")
        for name in ("channel_bind", "channel_advertise"):
            value = getattr(self, name)
            if value is not None and not _is_host(value):
                out.append(
                    f"{name} must be a host name or an IP address (no scheme, no port), "
                    f"got {value!r}"
                )
        if self.attackers and self.attack is None:
            out.append("attackers are given but no attack: set attack (e.g. 'reverse')")
        if len(set(self.attackers)) != len(self.attackers):
            out.append(f"attackers has duplicate ranks: {list(self.attackers)}")
        if self.attack is not None:
            try:
                get_attack(self.attack, n_byzantine=1, **self.attack_params)
            except RobustAggregationError as exc:
                out.append(str(exc))
        return out

    @property
    def update_timeout_s(self) -> float:
        """How long a worker waits for the aggregator's update after sending its gradient:
        the gather timeout plus ``update_margin_s`` (see the class docstring)."""
        return self.gather_timeout_s + self.update_margin_s

    @property
    def keepalive_s(self) -> float:
        """Within how long a channel socket declares a silent peer dead: the gather timeout."""
        return self.gather_timeout_s

    def workers_q(self, world_size: int) -> int:
        """How many gradients the aggregator waits for in a world of ``world_size`` workers."""
        return world_size if self.q is None else self.q

    def resized(self, world_size: int, first_world_size: int) -> DistributedConfig:
        """These settings for a job that started with ``first_world_size`` workers and now has
        ``world_size``: ``f`` stays, ``n = q`` follows the world, and an explicit ``q`` keeps
        the number of replies not waited for (``first_world_size - q``)."""
        if self.q is None or world_size == first_world_size:
            return self
        return self.replace(q=max(1, world_size - (first_world_size - self.q)))

    def check_world(self, world_size: int) -> None:
        """Raise :class:`DistributedConfigError` if the settings cannot run on ``world_size`` workers."""
        out = []
        if world_size < 1:
            out.append(f"need at least one worker, got {world_size}")
        q = self.workers_q(world_size)
        if q > world_size:
            out.append(f"q={q} exceeds the {world_size} workers")
        bad = [r for r in self.attackers if not 0 <= r < world_size]
        if bad:
            out.append(f"attacker ranks {bad} are not in [0, {world_size - 1}]")
        if self.straggler_rank is not None and not 0 <= self.straggler_rank < world_size:
            out.append(f"straggler_rank {self.straggler_rank} is not in [0, {world_size - 1}]")
        if self.train.batch_size < world_size:
            out.append(
                f"batch_size={self.train.batch_size} cannot give each of {world_size} workers "
                "a sample"
            )
        if not out:
            try:
                self.build_rule(world_size)
            except RobustAggregationError as exc:
                out.append(f"aggregator {self.aggregator!r} with n=q={q}, f={self.f}: {exc}")
        if out:
            raise DistributedConfigError("; ".join(out))

    def build_rule(self, world_size: int) -> Any:
        """The aggregation rule for ``q`` inputs (``n`` of :func:`~hapi_client.robust.get_aggregator` is q)."""
        return get_aggregator(
            self.aggregator, n=self.workers_q(world_size), f=self.f, **self.aggregator_params
        )

    def prefetch_depth(self, world_size: int, shard_size: int) -> int:
        """Shards each worker loads ahead: ``extract.prefetch``, else the library's rule
        (:func:`~hapi_client.options.prefetch_depth`) for one worker's even share of a batch."""
        share = math.ceil(self.train.batch_size / world_size)
        return prefetch_depth(self.extract.prefetch, share, shard_size)

    def replace(self, **changes: Any) -> DistributedConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["attackers"] = list(self.attackers)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DistributedConfig:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise DistributedConfigError(f"multi-worker config is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise DistributedConfigError("multi-worker config must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DistributedConfigError(f"unknown multi-worker settings: {', '.join(unknown)}")
        try:
            for name, kind in _OPTIONS.items():
                if isinstance(data.get(name), dict):
                    data[name] = kind(**data[name])
            return cls(**data)
        except (TypeError, ConfigurationError) as exc:
            raise DistributedConfigError(f"bad multi-worker config: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> DistributedConfig:
        return cls.from_json(Path(path).read_text())


def _is_host(value: str) -> bool:
    if _NAME.fullmatch(value):
        return True
    try:
        ipaddress.IPv6Address(value.strip("[]"))
    except ValueError:
        return False
    return True
