"""ResNet: the stem modules, each residual block, the pool and the classifier are layers.

A residual block is atomic (a cut inside it would have to ship the skip connection too).
ResNet18: 0 conv1, 1 bn1, 2 relu, 3 maxpool, 4-5 layer1, 6-7 layer2, 8-9 layer3, 10-11 layer4,
12 avgpool+flatten, 13 fc = 14 layers (Table 5.2), freeze 11 trains layer4.1 and fc.
ResNet50: the same with 3 + 4 + 6 + 3 bottlenecks = 22 layers, freeze 20 trains avgpool and fc
(the thesis' Table 5.2 says 20; the original code used 21).
"""

from __future__ import annotations

from torch import nn

from ..registry import ModelSpec, SplitLayout, register
from ..splittable import SplittableModel
from ..transforms import InputTransform
from ._common import named_layers, no_offline_weights, pool_then_flatten, torchvision_factory

IMAGENET = InputTransform()


def layer_names(blocks: tuple[int, ...]) -> tuple[str, ...]:
    """The stem, ``blocks[i]`` residual blocks of stage ``layer{i+1}``, the pool and ``fc``."""
    stages = [f"layer{s}.{b}" for s, count in enumerate(blocks, 1) for b in range(count)]
    return ("conv1", "bn1", "relu", "maxpool", *stages, "avgpool", "fc")


def _layers(net: nn.Module, names: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    return named_layers(net, names, {"avgpool": pool_then_flatten(net.get_submodule("avgpool"))})


def _builder(arch: str, freeze: int, names: tuple[str, ...]):  # type: ignore[no-untyped-def]
    def build(num_classes: int, pretrained: bool) -> SplittableModel:
        if pretrained:
            raise no_offline_weights(arch)
        net = torchvision_factory(arch)(weights=None, num_classes=num_classes)
        return SplittableModel(
            arch,
            _layers(net, names),
            default_freeze_index=freeze,
            transform=IMAGENET,
            num_classes=num_classes,
            native=net,
        )

    return build


for _arch, _freeze, _blocks in (
    ("resnet18", 11, (2, 2, 2, 2)),
    ("resnet50", 20, (3, 4, 6, 3)),
):
    _names = layer_names(_blocks)
    register(
        ModelSpec(
            name=_arch,
            builder=_builder(_arch, _freeze, _names),
            layout=SplitLayout(_names, _freeze),
            transform=IMAGENET,
            has_pretrained=False,
            description=f"torchvision {_arch}, one layer per residual block ({len(_names)} layers)",
        )
    )
