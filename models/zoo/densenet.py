"""DenseNet121: stem modules, each dense block, each transition's modules, the final norm and a head.

0 conv0, 1 norm0, 2 relu0, 3 pool0, 4 denseblock1, 5-8 transition1 (norm, relu, conv, pool),
9 denseblock2, 10-13 transition2, 14 denseblock3, 15-18 transition3, 19 denseblock4, 20 norm5,
21 classifier (the ReLU, global pool and flatten that torchvision's ``forward`` does functionally,
then the linear layer) = 22 layers (Table 5.2). Freeze 20 trains norm5 and the classifier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ..registry import ModelSpec, register
from ..splittable import SplittableModel
from ..transforms import InputTransform
from ._common import flatten_sequential, no_offline_weights, torchvision_factory

if TYPE_CHECKING:
    from torchvision import models as tvm

IMAGENET = InputTransform()
FREEZE = 20


def _layers(net: tvm.DenseNet) -> list[tuple[str, nn.Module]]:
    layers: list[tuple[str, nn.Module]] = []
    for name, module in net.features.named_children():
        if name.startswith("transition"):
            layers += flatten_sequential(f"features.{name}", module)
        else:
            layers.append((f"features.{name}", module))
    head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(1), net.classifier)
    layers.append(("classifier", head))
    return layers


def _build(num_classes: int, pretrained: bool) -> SplittableModel:
    if pretrained:
        raise no_offline_weights("densenet121")
    net = torchvision_factory("densenet121")(weights=None, num_classes=num_classes)
    return SplittableModel(
        "densenet121",
        _layers(net),
        default_freeze_index=FREEZE,
        transform=IMAGENET,
        num_classes=num_classes,
        native=net,
    )


register(
    ModelSpec(
        name="densenet121",
        builder=_build,
        default_freeze_index=FREEZE,
        num_layers=22,
        transform=IMAGENET,
        has_pretrained=False,
        description="torchvision densenet121, one layer per dense block, transitions flattened",
    )
)
