"""Helpers shared by the architecture modules."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ..errors import PretrainedWeightsUnavailableError


def flatten_sequential(prefix: str, seq: nn.Sequential) -> list[tuple[str, nn.Module]]:
    """The children of a container as named layers (``features.0``, ``features.1``, ...)."""
    return [(f"{prefix}.{name}", module) for name, module in seq.named_children()]


def pool_then_flatten(pool: nn.Module) -> nn.Module:
    """The pooling layer that precedes a classifier, with the flatten the torchvision forward does."""
    return nn.Sequential(pool, nn.Flatten(1))


def no_offline_weights(arch: str) -> PretrainedWeightsUnavailableError:
    return PretrainedWeightsUnavailableError(
        f"{arch} has no pretrained weights available offline (torchvision would download them); "
        "pass weights=None, or a safetensors file of your own, or use efficientnet_lite0"
    )


def torchvision_factory(arch: str) -> Callable[..., nn.Module]:
    """torchvision's builder of ``arch``, imported only when a model is built.

    torchvision takes seconds to import; registering the zoo (``import hapi_models``) and every
    client path that never builds a torchvision model stay without it.
    """
    from torchvision import models  # noqa: PLC0415 - deliberately lazy

    return getattr(models, arch)  # type: ignore[no-any-return]
