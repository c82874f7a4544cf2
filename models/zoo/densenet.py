"""DenseNet121: stem modules, each dense block, each transition's modules, the final norm and a head.

0 conv0, 1 norm0, 2 relu0, 3 pool0, 4 denseblock1, 5-8 transition1 (norm, relu, conv, pool),
9 denseblock2, 10-13 transition2, 14 denseblock3, 15-18 transition3, 19 denseblock4, 20 norm5,
21 classifier (the ReLU, global pool and flatten that torchvision's ``forward`` does functionally,
then the linear layer) = 22 layers (Table 5.2). Freeze 20 trains norm5 and the classifier.
"""

from __future__ import annotations

from torch import nn

from ..registry import ModelSpec, SplitLayout, register
from ..splittable import SplittableModel
from ..transforms import InputTransform
from ._common import named_layers, no_offline_weights, torchvision_factory

IMAGENET = InputTransform()
FREEZE = 20
_TRANSITION = ("norm", "relu", "conv", "pool")


def _layer_names(blocks: int = 4) -> tuple[str, ...]:
    names = ["features.conv0", "features.norm0", "features.relu0", "features.pool0"]
    for i in range(1, blocks + 1):
        names.append(f"features.denseblock{i}")
        if i < blocks:
            names += [f"features.transition{i}.{part}" for part in _TRANSITION]
    return (*names, "features.norm5", "classifier")


LAYER_NAMES = _layer_names()


def _build(num_classes: int, pretrained: bool) -> SplittableModel:
    if pretrained:
        raise no_offline_weights("densenet121")
    net = torchvision_factory("densenet121")(weights=None, num_classes=num_classes)
    classifier = net.get_submodule("classifier")
    head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(1), classifier)
    return SplittableModel(
        "densenet121",
        named_layers(net, LAYER_NAMES, {"classifier": head}),
        default_freeze_index=FREEZE,
        transform=IMAGENET,
        num_classes=num_classes,
        native=net,
    )


register(
    ModelSpec(
        name="densenet121",
        builder=_build,
        layout=SplitLayout(LAYER_NAMES, FREEZE),
        transform=IMAGENET,
        has_pretrained=False,
        description="torchvision densenet121, one layer per dense block, transitions flattened",
    )
)
