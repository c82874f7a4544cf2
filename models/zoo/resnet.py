"""ResNet: the stem modules, each residual block, the pool and the classifier are layers.

A residual block is atomic (a cut inside it would have to ship the skip connection too).
ResNet18: 0 conv1, 1 bn1, 2 relu, 3 maxpool, 4-5 layer1, 6-7 layer2, 8-9 layer3, 10-11 layer4,
12 avgpool+flatten, 13 fc = 14 layers (Table 5.2), freeze 11 trains layer4.1 and fc.
ResNet50: the same with 3 + 4 + 6 + 3 bottlenecks = 22 layers, freeze 20 trains avgpool and fc
(the thesis' Table 5.2 says 20; the original code used 21).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ..registry import ModelSpec, register
from ..splittable import SplittableModel
from ..transforms import InputTransform
from ._common import flatten_sequential, no_offline_weights, pool_then_flatten, torchvision_factory

if TYPE_CHECKING:
    from torchvision import models as tvm

IMAGENET = InputTransform()


def _layers(net: tvm.ResNet) -> list[tuple[str, nn.Module]]:
    layers: list[tuple[str, nn.Module]] = [
        ("conv1", net.conv1),
        ("bn1", net.bn1),
        ("relu", net.relu),
        ("maxpool", net.maxpool),
    ]
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        layers += flatten_sequential(stage, getattr(net, stage))
    layers += [("avgpool", pool_then_flatten(net.avgpool)), ("fc", net.fc)]
    return layers


def _builder(arch: str, freeze: int):  # type: ignore[no-untyped-def]
    def build(num_classes: int, pretrained: bool) -> SplittableModel:
        if pretrained:
            raise no_offline_weights(arch)
        net = torchvision_factory(arch)(weights=None, num_classes=num_classes)
        return SplittableModel(
            arch,
            _layers(net),
            default_freeze_index=freeze,
            transform=IMAGENET,
            num_classes=num_classes,
            native=net,
        )

    return build


for _arch, _freeze, _n in (
    ("resnet18", 11, 14),
    ("resnet50", 20, 22),
):
    register(
        ModelSpec(
            name=_arch,
            builder=_builder(_arch, _freeze),
            default_freeze_index=_freeze,
            num_layers=_n,
            transform=IMAGENET,
            has_pretrained=False,
            description=f"torchvision {_arch}, one layer per residual block ({_n} layers)",
        )
    )
