"""AlexNet and VGG: every module of ``features`` and ``classifier`` is one layer.

Rule (one per family, as the thesis' Table 5.2 counts "only layers where a split makes sense"):
the ``features`` and ``classifier`` containers are flattened, each conv, ReLU, pool, dropout and
linear is one layer, and the adaptive average pool (with the flatten torchvision does in
``forward``) is one layer. This yields AlexNet 13 + 1 + 7 = 21 and VGG11 21 + 1 + 7 = 29,
VGG19 37 + 1 + 7 = 45 layers. Table 5.2 prints 22 for AlexNet and 28 for VGG11, which no single
counting rule reproduces together with VGG19's 45; we keep the one consistent rule and the
table's freeze indices (AlexNet 17, VGG11 25, VGG19 36).

AlexNet layers: 0 conv1, 1 relu, 2 maxpool, 3 conv2, 4 relu, 5 maxpool, 6 conv3, 7 relu, 8 conv4,
9 relu, 10 conv5, 11 relu, 12 maxpool, 13 avgpool+flatten, 14 dropout, 15 fc6, 16 relu,
17 dropout, 18 fc7, 19 relu, 20 fc8. Freeze 17 trains fc7 and fc8.
"""

from __future__ import annotations

from typing import cast

from torch import nn

from ..registry import ModelSpec, register
from ..splittable import SplittableModel
from ..transforms import InputTransform
from ._common import flatten_sequential, no_offline_weights, pool_then_flatten, torchvision_factory

IMAGENET = InputTransform()


def _split_features_classifier(
    arch: str, net: nn.Module, freeze: int, num_classes: int
) -> SplittableModel:
    features = cast(nn.Sequential, net.features)
    classifier = cast(nn.Sequential, net.classifier)
    layers = [
        *flatten_sequential("features", features),
        ("avgpool", pool_then_flatten(cast(nn.Module, net.avgpool))),
        *flatten_sequential("classifier", classifier),
    ]
    return SplittableModel(
        arch,
        layers,
        default_freeze_index=freeze,
        transform=IMAGENET,
        num_classes=num_classes,
        native=net,
    )


def _builder(arch: str, freeze: int):  # type: ignore[no-untyped-def]
    def build(num_classes: int, pretrained: bool) -> SplittableModel:
        if pretrained:
            raise no_offline_weights(arch)
        net = torchvision_factory(arch)(weights=None, num_classes=num_classes)
        return _split_features_classifier(arch, net, freeze, num_classes)

    return build


for _arch, _freeze, _layers in (
    ("alexnet", 17, 21),
    ("vgg11", 25, 29),
    ("vgg19", 36, 45),
):
    register(
        ModelSpec(
            name=_arch,
            builder=_builder(_arch, _freeze),
            default_freeze_index=_freeze,
            num_layers=_layers,
            transform=IMAGENET,
            has_pretrained=False,
            description=f"torchvision {_arch}, features/classifier flattened ({_layers} layers)",
        )
    )
