"""What a multi-worker run returns: per-epoch metrics and rank 0's result (also its JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import hapi_models

from ..metrics import EpochSummary

__all__ = ["DistributedEpochMetrics", "DistributedResult", "EpochStats"]


@dataclass(kw_only=True)
class DistributedEpochMetrics(EpochSummary):
    """One epoch of a multi-worker run, as rank 0 saw it (bytes and requests of all workers)."""

    rounds: int
    replies_used: int
    replies_missing: int
    skipped_rounds: int
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
    #: The global round the run resumed after (None: it started afresh).
    resumed_round: int | None = None

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


@dataclass
class EpochStats:
    """What one rank counts during an epoch (rank 0 also sums the replies it received)."""

    assigned: int = 0
    skipped: int = 0
    replies_used: int = 0
    replies_missing: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    samples: int = 0
