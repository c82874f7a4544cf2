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

from ..registry import ModelSpec, SplitLayout, register
from ..splittable import SplittableModel
from ..transforms import InputTransform
from ._common import named_layers, no_offline_weights, pool_then_flatten, torchvision_factory

IMAGENET = InputTransform()


def _vgg(convs_per_stage: tuple[int, ...]) -> tuple[str, ...]:
    """VGG's ``features``: per stage, a conv and a ReLU per conv, then a max pool."""
    return tuple(m for convs in convs_per_stage for m in ("conv", "relu") * convs + ("pool",))


#: The modules of each ``features`` and ``classifier`` container, in torchvision's order.
_ALEXNET_FEATURES = ("conv", "relu", "pool") * 2 + ("conv", "relu") * 3 + ("pool",)
_ALEXNET_CLASSIFIER = ("dropout", "fc", "relu") * 2 + ("fc",)
_VGG_CLASSIFIER = ("fc", "relu", "dropout") * 2 + ("fc",)


def _layer_names(features: tuple[str, ...], classifier: tuple[str, ...]) -> tuple[str, ...]:
    return (
        *(f"features.{i}" for i in range(len(features))),
        "avgpool",
        *(f"classifier.{i}" for i in range(len(classifier))),
    )


def _builder(arch: str, freeze: int, names: tuple[str, ...]):  # type: ignore[no-untyped-def]
    def build(num_classes: int, pretrained: bool) -> SplittableModel:
        if pretrained:
            raise no_offline_weights(arch)
        net = torchvision_factory(arch)(weights=None, num_classes=num_classes)
        avgpool = pool_then_flatten(cast(nn.Module, net.avgpool))
        return SplittableModel(
            arch,
            named_layers(net, names, {"avgpool": avgpool}),
            default_freeze_index=freeze,
            transform=IMAGENET,
            num_classes=num_classes,
            native=net,
        )

    return build


for _arch, _freeze, _features, _classifier in (
    ("alexnet", 17, _ALEXNET_FEATURES, _ALEXNET_CLASSIFIER),
    ("vgg11", 25, _vgg((1, 1, 2, 2, 2)), _VGG_CLASSIFIER),
    ("vgg19", 36, _vgg((2, 2, 4, 4, 4)), _VGG_CLASSIFIER),
):
    _names = _layer_names(_features, _classifier)
    register(
        ModelSpec(
            name=_arch,
            builder=_builder(_arch, _freeze, _names),
            layout=SplitLayout(_names, _freeze),
            transform=IMAGENET,
            has_pretrained=False,
            description=f"torchvision {_arch}, features/classifier flattened ({len(_names)} layers)",
        )
    )
