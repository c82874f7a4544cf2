"""Settings of a multi-worker run: one JSON-serialisable value object shared by every rank.

The launcher writes it to a file that each torchrun worker reads, so every rank runs with
exactly the same settings; credentials never go into it (they travel in ``ST_AUTH``,
``ST_USER``, ``ST_KEY``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hapi_models

from hapi_contract import DEFAULT_COMPRESSION, DEFAULT_OUTPUT_DTYPE

from ..client import DEFAULT_ENDPOINT
from ..robust import RobustAggregationError, get_aggregator, get_attack
from .errors import DistributedConfigError

__all__ = ["DistributedConfig"]

_MODES = ("hapi", "baseline")
_DEVICES = ("auto", "cpu", "cuda")
_BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class DistributedConfig:
    """Everything a multi-worker fine-tuning run needs, except the world size and credentials.

    Data and model (as :func:`hapi_client.run_finetune`): ``model`` is a descriptor such as
    ``models/efficientnet_lite0``; ``batch_size`` is the *global* batch of one round, split over
    the workers (evenly, or by LB-BSP when ``balance``); ``mode`` is ``hapi`` or ``baseline``.

    Robustness: ``aggregator`` (a :func:`hapi_client.robust.get_aggregator` name) is built for
    ``n = q`` inputs (``q`` defaults to the number of workers) and ``f`` declared Byzantine
    ones; the aggregator waits ``gather_timeout_s`` at most for the fastest ``q`` gradients.
    ``attackers`` are the ranks that replace their gradient with ``attack``'s output (the
    declared ``f`` is separate from ``len(attackers)``).

    Heterogeneity: ``balance`` turns LB-BSP on; ``straggler_rank`` sleeps
    ``straggler_delay_s`` seconds per sample of its batch (a simulated slow GPU).
    """

    model: str
    container: str
    endpoint: str = DEFAULT_ENDPOINT
    via: str = "hapi"
    eval_container: str | None = None
    num_classes: int | None = None
    freeze_index: int | None = None
    split: int | str = "auto"
    mode: str = "hapi"
    batch_size: int = 64
    epochs: int = 1
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 0
    output_dtype: str = DEFAULT_OUTPUT_DTYPE.value
    compression: str = DEFAULT_COMPRESSION.value
    b_max: int | None = None
    cache_features: bool = True
    image_size: int | None = None
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
    prefetch: int = 2
    channel_host: str | None = None
    channel_timeout_s: float = 600.0
    results_path: str | None = None
    save_path: str | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "attackers", tuple(int(r) for r in self.attackers))
        problems = list(self._static_problems())
        if problems:
            raise DistributedConfigError("; ".join(problems))

    def _static_problems(self) -> list[str]:
        out = []
        if "/" not in self.model:
            out.append(f"model must look like 'models/efficientnet_lite0', got {self.model!r}")
        if self.mode not in _MODES:
            out.append(
                f"mode must be one of {', '.join(_MODES)} for multi-worker runs, got {self.mode!r}"
            )
        if self.device not in _DEVICES and not self.device.startswith("cuda:"):
            out.append(
                f"device must be one of {', '.join(_DEVICES)} or cuda:N, got {self.device!r}"
            )
        if self.backend not in _BACKENDS:
            out.append(f"backend must be one of {', '.join(_BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.split, int) and self.split not in ("auto", "thesis", "freeze"):
            out.append(
                f"split must be 'auto', 'thesis', 'freeze' or a layer index, got {self.split!r}"
            )
        for name in ("batch_size", "epochs", "checksum_every", "prefetch"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            out.append(f"threads must be >= 1, got {self.threads}")
        if self.f < 0:
            out.append(f"f must be >= 0, got {self.f}")
        if self.q is not None and self.q < 1:
            out.append(f"q must be >= 1, got {self.q}")
        if self.max_rounds_per_epoch is not None and self.max_rounds_per_epoch < 1:
            out.append(f"max_rounds_per_epoch must be >= 1, got {self.max_rounds_per_epoch}")
        for name in ("bandwidth_bytes_per_s", "throttle_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                out.append(f"{name} must be a positive number, got {value}")
        for name in ("gather_timeout_s", "channel_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                out.append(f"{name} must be a positive number of seconds, got {value}")
        if not (math.isfinite(self.straggler_delay_s) and self.straggler_delay_s >= 0):
            out.append(f"straggler_delay_s must be >= 0, got {self.straggler_delay_s}")
        if self.attackers and self.attack is None:
            out.append("attackers are given but no attack: set attack (e.g. 'reverse')")
        if len(set(self.attackers)) != len(self.attackers):
            out.append(f"attackers has duplicate ranks: {list(self.attackers)}")
        try:
            self.optimizer_config()
        except ValueError as exc:
            out.append(str(exc))
        if self.attack is not None:
            try:
                get_attack(self.attack, n_byzantine=1, **self.attack_params)
            except RobustAggregationError as exc:
                out.append(str(exc))
        return out

    def workers_q(self, world_size: int) -> int:
        """How many gradients the aggregator waits for in a world of ``world_size`` workers."""
        return world_size if self.q is None else self.q

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
        if self.batch_size < world_size:
            out.append(
                f"batch_size={self.batch_size} cannot give each of {world_size} workers a sample"
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

    def optimizer_config(self) -> hapi_models.OptimizerConfig:
        return hapi_models.OptimizerConfig(
            self.optimizer, self.lr, self.momentum, self.weight_decay
        )

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
            return cls(**data)
        except TypeError as exc:
            raise DistributedConfigError(f"bad multi-worker config: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path) -> DistributedConfig:
        return cls.from_json(Path(path).read_text())
