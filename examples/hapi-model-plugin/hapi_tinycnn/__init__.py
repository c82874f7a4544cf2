"""An example HAPI model plugin: ``tinycnn``, a small CNN for 64x64 images.

The entry point names :func:`build`; HAPI traces the network it returns and cuts it at every
point where one tensor is alive (after each block, the pooling and the flattening), so the
plugin writes no layer list of its own.
"""

from __future__ import annotations

from hapi_models import InputTransform

from .network import TinyCNN

__all__ = ["TinyCNN", "build"]


def build(num_classes: int) -> TinyCNN:
    """The network HAPI serves as ``tinycnn``, with a ``num_classes``-way classifier."""
    return TinyCNN(num_classes)


# Read by HAPI at registration: the network is made for small crops (ImageNet's statistics).
build.hapi_transform = InputTransform(resize=72, crop=64)  # type: ignore[attr-defined]
build.hapi_description = "TinyCNN: four conv blocks for 64x64 crops (example plugin)"  # type: ignore[attr-defined]
