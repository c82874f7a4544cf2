"""The fine-tuning options, grouped once: what every way of training through HAPI shares.

Two frozen value objects, as httpx groups ``Timeout`` and ``Limits``:

* :class:`TrainOptions`: how the trainable layers learn (batch, epochs, optimizer, seed);
* :class:`ExtractOptions`: where the model is split and how the features are made and travel
  (split rule, freeze index, crop size, wire dtype, compression, COS batch cap, cache,
  prefetch depth).

The recipe (:func:`~hapi_client.finetune.run_finetune`), the multi-worker trainer
(:class:`~hapi_client.distributed.DistributedConfig`), ``hapi finetune`` and the benchmarks'
``RunSpec`` take these same objects. Each checks itself when built and raises
:class:`~hapi_client.ConfigurationError` naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import hapi_models
from hapi_models.finetune import OPTIMIZERS

from hapi_contract import DEFAULT_COMPRESSION, DEFAULT_OUTPUT_DTYPE, Compression, OutputDtype

from .errors import ConfigurationError
from .planning.decision import SPLIT_RULES, SplitChoice

__all__ = ["ExtractOptions", "TrainOptions", "prefetch_depth"]


def _positive_int(name: str, value: object, *, optional: bool = False, minimum: int = 1) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _number(name: str, value: object, *, positive: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):  # type: ignore[operator]
        raise ConfigurationError(
            f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}"
        )


@dataclass(frozen=True)
class TrainOptions:
    """How the trainable layers ``[freeze, n)`` learn.

    ``batch_size`` is the samples of one iteration (in a multi-worker run: of one round, shared
    by the workers); ``optimizer`` is ``"sgd"``, ``"adam"`` or ``"adamw"`` (``momentum`` counts
    for SGD only); ``seed`` fixes the epoch order and the new classifier's initialisation.
    """

    batch_size: int = 64
    epochs: int = 1
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        _positive_int("batch_size", self.batch_size)
        _positive_int("epochs", self.epochs)
        if self.optimizer not in OPTIMIZERS:
            raise ConfigurationError(
                f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
            )
        _number("lr", self.lr, positive=True)
        _number("momentum", self.momentum, positive=False)
        _number("weight_decay", self.weight_decay, positive=False)
        _positive_int("seed", self.seed, minimum=0)

    @classmethod
    def with_optimizer(cls, config: hapi_models.OptimizerConfig, **changes: Any) -> TrainOptions:
        """Options with ``config``'s optimizer settings (and ``changes``)."""
        return cls(
            optimizer=config.name,
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            **changes,
        )

    def optimizer_config(self) -> hapi_models.OptimizerConfig:
        """The optimizer to build over the trainable parameters."""
        return hapi_models.OptimizerConfig(
            self.optimizer, self.lr, self.momentum, self.weight_decay
        )

    def replace(self, **changes: Any) -> TrainOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ExtractOptions:
    """Where the model is split and how the split-layer features are made and travel.

    ``split``: ``"auto"`` (the smallest predicted time of the whole job), ``"thesis"`` (thesis
    Algorithm 2), ``"freeze"`` or a layer index in ``[0, freeze_index]``. ``freeze_index``:
    layers before it stay frozen (None: the architecture's). ``image_size``: the crop size
    (None: the model's). ``output_dtype``, ``compression``: the features on the wire (strings
    are accepted and stored as the enums). ``b_max``: the largest COS batch the server may use
    (None: the training batch, at most one shard and 1000). ``cache_features``: keep the frozen split's features for
    later epochs. ``prefetch``: shards loaded ahead (None: :func:`prefetch_depth`'s rule, enough
    for one batch and at least 2, 3 from a HAPI server directly; a multi-worker run applies it
    to each worker's share).
    """

    split: SplitChoice = "auto"
    freeze_index: int | None = None
    image_size: int | None = None
    output_dtype: OutputDtype = DEFAULT_OUTPUT_DTYPE
    compression: Compression = DEFAULT_COMPRESSION
    b_max: int | None = None
    cache_features: bool = True
    prefetch: int | None = None

    def __post_init__(self) -> None:
        split = self.split
        if isinstance(split, bool) or not (
            (isinstance(split, int) and split >= 0) or split in SPLIT_RULES
        ):
            raise ConfigurationError(
                f"split must be 'auto', 'thesis', 'freeze' or a layer index >= 0, got {split!r}"
            )
        _positive_int("freeze_index", self.freeze_index, optional=True, minimum=0)
        _positive_int("image_size", self.image_size, optional=True)
        _positive_int("b_max", self.b_max, optional=True)
        _positive_int("prefetch", self.prefetch, optional=True)
        if not isinstance(self.cache_features, bool):
            raise ConfigurationError(f"cache_features must be a bool, got {self.cache_features!r}")
        try:
            object.__setattr__(self, "output_dtype", OutputDtype(self.output_dtype))
            object.__setattr__(self, "compression", Compression(self.compression))
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc

    def replace(self, **changes: Any) -> ExtractOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


def prefetch_depth(
    prefetch: int | None, batch_size: int, shard_size: int, *, ordered: bool = False
) -> int:
    """Shards to load ahead: ``prefetch`` when given, else enough to fill one batch of
    ``batch_size`` samples from shards of ``shard_size`` plus the next shard, at least 2, or
    at least 3 where the responses arrive in the order asked (``ordered``: a HAPI server sends
    one client's responses oldest first): one arriving, the next ready behind it, the one after
    being computed, so the link never waits for the server. Unordered, a third shard in flight
    only shares the link with the two before it and delays them."""
    return prefetch or max(3 if ordered else 2, math.ceil(batch_size / shard_size) + 1)
