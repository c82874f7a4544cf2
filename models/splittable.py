"""A model as an ordered list of split-worthy layers.

Layer ``i`` consumes the output of layer ``i - 1``; ``head(s)`` runs layers ``[0, s)`` (on the
storage side) and ``tail(s)`` runs ``[s, num_layers)`` (on the compute tier), so for every split
``tail(s)(head(s)(x)) == model(x)``. Head and tail share parameters with the model (no copies).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .errors import SplitIndexError
from .transforms import InputTransform


class SplittableModel(nn.Module):
    """An ``nn.Sequential``-like model whose layers can be cut at any index."""

    def __init__(
        self,
        arch: str,
        layers: Sequence[tuple[str, nn.Module]],
        *,
        default_freeze_index: int,
        transform: InputTransform,
        num_classes: int,
        native: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if not layers:
            raise ValueError("a splittable model needs at least one layer")
        self.arch = arch
        self.num_classes = num_classes
        self.transform = transform
        self.layer_names: list[str] = [name for name, _ in layers]
        # ModuleList keys must not contain dots; the readable names live in layer_names.
        self.layers = nn.ModuleList([module for _, module in layers])
        self.default_freeze_index = self._check_index(default_freeze_index, "freeze index")
        #: ``native`` network's state-dict key -> this model's key, for every tensor the two
        #: share (the layers are the native modules themselves): how a checkpoint written for
        #: the torchvision/timm network is read into the layer list.
        self.native_keys: dict[str, str] = {} if native is None else _shared_keys(native, self)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def _check_index(self, index: int, what: str = "split index") -> int:
        if isinstance(index, bool) or not isinstance(index, int):
            raise SplitIndexError(f"{what} must be an integer, got {index!r}")
        if not 0 <= index <= self.num_layers:
            raise SplitIndexError(
                f"{what} {index} out of range for {self.arch}: must be in [0, {self.num_layers}]"
            )
        return index

    def head(self, split: int) -> nn.Sequential:
        """Layers ``[0, split)``: what the HAPI server runs. ``head(0)`` is the identity."""
        split = self._check_index(split)
        return nn.Sequential(*self.layers[:split])

    def tail(self, split: int) -> nn.Sequential:
        """Layers ``[split, num_layers)``: what the client runs on the received features."""
        split = self._check_index(split)
        return nn.Sequential(*self.layers[split:])

    def freeze(self, freeze_index: int | None = None) -> None:
        """Make layers ``[0, freeze_index)`` non-trainable (the feature-extraction phase)."""
        index = self.default_freeze_index if freeze_index is None else freeze_index
        index = self._check_index(index, "freeze index")
        for i, layer in enumerate(self.layers):
            layer.requires_grad_(i >= index)

    def replace_classifier(self, num_classes: int, *, seed: int = 0) -> None:
        """Give the last layer's classifier ``num_classes`` outputs, freshly initialised.

        The classifier is the last layer's final ``nn.Linear``, or, in a network without one
        (SqueezeNet), its final 1x1 ``nn.Conv2d``. Transfer learning keeps the pretrained
        features and learns a new head; the seed makes the new head identical wherever it is
        built (client or server).
        """
        # The layers after the classifier hold no parameters (SqueezeNet's pool and flatten).
        found, index = None, self.num_layers
        while found is None and index > self.default_freeze_index:
            index -= 1
            layer = self.layers[index]
            found = _last_classifier(layer, nn.Linear) or _last_classifier(layer, nn.Conv2d)
        if found is None:
            raise ValueError(f"{self.arch}: no trainable layer holds a classifier to replace")
        container, name, old = found
        generator_state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            if isinstance(old, nn.Linear):
                new: nn.Module = nn.Linear(old.in_features, num_classes)
            else:
                assert isinstance(old, nn.Conv2d)
                new = nn.Conv2d(old.in_channels, num_classes, kernel_size=1)
        finally:
            torch.random.set_rng_state(generator_state)
        new = new.to(old.weight.device)
        if container is None:
            self.layers[index] = new
        else:
            setattr(container, name, new)
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def extra_repr(self) -> str:
        return f"arch={self.arch}, num_layers={self.num_layers}, freeze={self.default_freeze_index}"


def _last_classifier(
    layer: nn.Module, kind: type[nn.Module]
) -> tuple[nn.Module | None, str, nn.Module] | None:
    """``(parent, attribute, module)`` of the last ``kind`` module in ``layer`` (parent None:
    ``layer`` itself), or None. A 1x1 kernel is required of a convolution."""
    if isinstance(layer, kind) and _is_head(layer):
        return None, "", layer
    found = None
    for parent in layer.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, kind) and _is_head(child):
                found = (parent, child_name, child)
    return found


def _is_head(module: nn.Module) -> bool:
    return not isinstance(module, nn.Conv2d) or tuple(module.kernel_size) == (1, 1)


def _shared_keys(native: nn.Module, model: nn.Module) -> dict[str, str]:
    ours = {id(t): k for k, t in model.state_dict(keep_vars=True).items()}
    theirs = native.state_dict(keep_vars=True).items()
    return {k: ours[id(t)] for k, t in theirs if id(t) in ours}
