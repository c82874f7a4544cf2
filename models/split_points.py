"""What each split point of an architecture ships: the layer's name and one sample's output.

Computed on the meta device (shapes only: nothing is allocated or computed), so listing the
split points of a ViT-H costs what listing AlexNet's does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .registry import get_model, get_spec

__all__ = ["SplitPoint", "split_points"]


@dataclass(frozen=True)
class SplitPoint:
    """Split index ``index``: the head runs layers ``[0, index)`` and ships ``sample_shape``.

    ``name`` is the last layer the head runs (``input`` for index 0: the decoded image).
    """

    index: int
    name: str
    sample_shape: tuple[int, ...]

    @property
    def values_per_sample(self) -> int:
        return math.prod(self.sample_shape)

    def bytes_per_sample(self, element_bytes: int = 4) -> int:
        """Bytes one sample's output takes on the wire at ``element_bytes`` per value."""
        return self.values_per_sample * element_bytes


def split_points(arch: str) -> list[SplitPoint]:
    """Every split point of ``arch``, from 0 (ship the decoded image) to the whole network.

    Raises:
        UnknownModelError, UntraceableModelError, PluginError: as :func:`~hapi_models.get_spec`
            and building the model raise them.
    """
    spec = get_spec(arch)
    with torch.device("meta"):
        model = get_model(arch, num_classes=1000)
        x = torch.empty((1, *spec.transform.input_shape))
    points = [SplitPoint(0, "input", tuple(x.shape[1:]))]
    with torch.no_grad():
        for index, (name, layer) in enumerate(zip(model.layer_names, model.layers, strict=True)):
            x = layer(x)
            points.append(SplitPoint(index + 1, name, tuple(x.shape[1:])))
    return points
