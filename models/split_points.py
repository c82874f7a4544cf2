"""What each split point of an architecture ships: the layer's name and one sample's output.

Computed from shapes only (a graph's traced shapes, or a forward on the meta device: nothing is
allocated or computed), so listing the split points of a ViT-H costs what listing AlexNet's does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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

    As the architecture listing describes it (:func:`~hapi_models.describe_model`: kept in this
    process and on disk, so a network is traced once, not once per caller).

    Raises:
        UnknownModelError, UntraceableModelError, PluginError: as :func:`~hapi_models.get_spec`
            and building the model raise them.
    """
    from .listing import describe_model  # noqa: PLC0415 - the listing imports SplitPoint

    return describe_model(arch).split_points()
