"""The model registry: architecture name -> builder of a :class:`SplittableModel`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import UnknownModelError
from .splittable import SplittableModel
from .transforms import InputTransform

log = logging.getLogger(__name__)

Builder = Callable[[int, bool], SplittableModel]
"""``builder(num_classes, pretrained) -> SplittableModel``."""


@dataclass(frozen=True)
class ModelSpec:
    """An architecture: its builder and ``layer_names``, the split points the builder makes."""

    name: str
    builder: Builder
    default_freeze_index: int
    layer_names: tuple[str, ...]
    transform: InputTransform
    has_pretrained: bool
    description: str

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)


_REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"model {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec


def list_models() -> list[str]:
    """Names of every registered architecture, sorted."""
    return sorted(_REGISTRY)


def get_spec(name: str) -> ModelSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownModelError(name, list_models()) from None


def get_model(
    name: str,
    num_classes: int = 1000,
    weights: str | Path | bytes | None = None,
    *,
    sha256: str | None = None,
) -> SplittableModel:
    """Build a registered model.

    ``weights``: ``None`` (random init from torch's global RNG), ``"imagenet"`` (the packaged
    pretrained weights, where the architecture has them offline), a path to a ``.safetensors``
    file, or the safetensors bytes. When ``sha256`` is given the blob is verified first.
    """
    from .weights import load_weights  # local: weights imports the registry for its errors

    spec = get_spec(name)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    pretrained = isinstance(weights, str) and weights == "imagenet"
    model = spec.builder(num_classes, pretrained)
    if weights is not None and not pretrained:
        load_weights(model, weights, sha256=sha256)
    model.eval()
    return model
