"""Per-layer profile of a splittable model from one batch-1 forward pass.

The client sends this profile with every request: output bytes per sample drive the split choice
and the activation estimate drives the server's batch adaptation (the thesis' M_r(data)).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .splittable import SplittableModel


@dataclass(frozen=True)
class LayerProfile:
    name: str
    output_shape: tuple[int, ...]
    """Shape of one sample's output (batch dimension removed)."""
    output_bytes_per_sample: int
    """Bytes of one sample's output at float32: what a split after this layer ships."""
    activation_bytes_per_sample: int
    """Peak bytes one sample needs while this layer runs: its input, plus the largest
    input+output pair among its inner modules (at least its own output)."""
    weight_bytes: int


@dataclass(frozen=True)
class ModelProfile:
    arch: str
    input_shape: tuple[int, int, int]
    input_bytes_per_sample: int
    layers: list[LayerProfile] = field(default_factory=list)
    weight_bytes: int = 0
    seconds: float = 0.0

    def head_activation_bytes_per_sample(self, split: int) -> int:
        """Peak per-sample activation memory of running layers ``[0, split)``."""
        if split <= 0:
            return self.input_bytes_per_sample
        return max(layer.activation_bytes_per_sample for layer in self.layers[:split])

    def head_weight_bytes(self, split: int) -> int:
        return sum(layer.weight_bytes for layer in self.layers[:split])

    def output_bytes(self, split: int) -> int:
        """Per-sample bytes crossing the wire for a split (the input tensor at split 0)."""
        return (
            self.input_bytes_per_sample
            if split == 0
            else self.layers[split - 1].output_bytes_per_sample
        )


def _nbytes(t: object) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (tuple, list)):
        return sum(_nbytes(x) for x in t)
    return 0


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters()) + sum(
        b.numel() * b.element_size() for b in module.buffers()
    )


@torch.inference_mode()
def profile(
    model: SplittableModel,
    input_shape: tuple[int, int, int] | None = None,
    *,
    device: str | torch.device = "meta",
) -> ModelProfile:
    """Run one batch-1 forward pass with hooks and measure every layer.

    By default the pass runs on the ``meta`` device: parameters are swapped for data-less meta
    tensors (``torch.func.functional_call``; nothing is copied), so every shape and byte count is
    exact while no arithmetic runs, which takes milliseconds even for VGG19. ``device="cpu"`` (or a
    CUDA device) runs the real computation on the model's own weights instead.

    Uses the model's own transform shape when ``input_shape`` is omitted. The model is put in
    eval mode for the pass and restored afterwards.
    """
    shape = tuple(input_shape) if input_shape is not None else model.transform.input_shape
    if len(shape) != 3 or any(d < 1 for d in shape):
        raise ValueError(f"input_shape must be (C, H, W) with positive sizes, got {shape}")
    on_meta = torch.device(device).type == "meta"
    if on_meta:
        swapped = {
            name: torch.empty_like(t, device="meta")
            for name, t in [*model.named_parameters(), *model.named_buffers()]
        }
        x = torch.zeros((1, *shape), device="meta")
    else:
        x = torch.zeros((1, *shape), device=device)

    inner_peak: dict[int, int] = {}
    current: list[int] = [-1]
    handles: list[RemovableHandle] = []

    def leaf_hook(_m: nn.Module, inputs: tuple[object, ...], output: object) -> None:
        idx = current[0]
        inner_peak[idx] = max(inner_peak.get(idx, 0), _nbytes(inputs) + _nbytes(output))

    for layer in model.layers:
        for sub in layer.modules():
            if next(sub.children(), None) is None:
                handles.append(sub.register_forward_hook(leaf_hook))

    was_training = model.training
    model.eval()
    start = time.perf_counter()
    layers: list[LayerProfile] = []
    try:
        for i, (name, layer) in enumerate(zip(model.layer_names, model.layers, strict=True)):
            current[0] = i
            in_bytes = _nbytes(x)
            if on_meta:
                prefix = f"layers.{i}."
                local = {k[len(prefix) :]: v for k, v in swapped.items() if k.startswith(prefix)}
                x = torch.func.functional_call(layer, local, (x,))
            else:
                x = layer(x)
            out_bytes = _nbytes(x)
            activation = in_bytes + max(out_bytes, inner_peak.get(i, 0))
            layers.append(
                LayerProfile(
                    name=name,
                    output_shape=tuple(x.shape[1:]),
                    output_bytes_per_sample=out_bytes,
                    activation_bytes_per_sample=activation,
                    weight_bytes=_param_bytes(layer),
                )
            )
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    elapsed = time.perf_counter() - start
    return ModelProfile(
        arch=model.arch,
        input_shape=(int(shape[0]), int(shape[1]), int(shape[2])),
        input_bytes_per_sample=int(shape[0] * shape[1] * shape[2]) * 4,
        layers=layers,
        weight_bytes=_param_bytes(model),
        seconds=elapsed,
    )
