"""Helpers shared by the architecture modules."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from torch import nn

from ..errors import PretrainedWeightsUnavailableError


def named_layers(
    net: nn.Module, names: Sequence[str], replaced: Mapping[str, nn.Module] | None = None
) -> list[tuple[str, nn.Module]]:
    """The layers ``names`` of ``net``, in order: its submodules of those names, or ``replaced``'s.

    Each architecture declares its layer names once, and its :class:`~..registry.ModelSpec`
    counts them; ``replaced`` holds the layers that are not a submodule as they are (a pool with
    the flatten torchvision's ``forward`` does, a classifier with its functional prelude).
    """
    replaced = replaced or {}
    return [
        (name, replaced[name] if name in replaced else net.get_submodule(name)) for name in names
    ]


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
