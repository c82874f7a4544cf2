"""Per-layer profile of a splittable model from one batch-1 forward pass.

The client sends this profile with every request: output bytes per sample drive the split choice
and the activation estimate drives the server's batch adaptation (the thesis' M_r(data)).
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from .errors import InputSizeError
from .splittable import SplittableModel


@dataclass(frozen=True)
class LayerProfile:
    name: str
    output_shape: tuple[int, ...]
    """Shape of one sample's output (batch dimension removed)."""
    output_bytes_per_sample: int
    """Bytes of one sample's output at float32: what a split after this layer ships."""
    activation_bytes_per_sample: int
    """Peak bytes one sample needs while this layer runs: the most tensor storage alive at once
    during its forward pass (its input included), every aten op counted, functional ones
    (matmuls, attention, residual adds, copying reshapes) too; at least its input plus the
    largest input+output pair among its inner modules and its own output."""
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


class _LiveStorage(TorchDispatchMode):
    """Bytes of tensor storage alive, and their peak, across the aten ops run under it.

    Every op's output storages are counted once (a view or an in-place result shares its
    input's storage) and uncounted when the storage is freed: PyTorch keeps one Python object
    per storage for as long as any tensor uses it, so a weak reference to it dies exactly when
    the last tensor does. Meta tensors have real storage sizes, so this works without data.

    Written here because torch's own tracker, ``torch.distributed._tools.mem_tracker.MemTracker``,
    is made for training: it registers gradient hooks on every parameter (refused under
    ``inference_mode``), files parameters met inside modules under another category mid-pass,
    and keeps one global peak where each layer needs its own.
    """

    def __init__(self, ignore: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        # Parameters and buffers are weights, not activations: their views (a linear's
        # transposed weight) must not count as new storage.
        self._ignored = {t.untyped_storage()._cdata for t in ignore}
        self._tracked: dict[int, tuple[int, weakref.ref[torch.UntypedStorage]]] = {}

    def reset_peak(self) -> None:
        self.peak = self.live

    def track(self, value: object) -> None:
        for t in tree_flatten(value)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in self._ignored or key in self._tracked:
                continue
            nbytes = st.nbytes()
            self._tracked[key] = (nbytes, weakref.ref(st, functools.partial(self._free, key)))
            self.live += nbytes
        self.peak = max(self.peak, self.live)

    def _free(self, key: int, _ref: object = None) -> None:
        entry = self._tracked.pop(key, None)
        if entry is not None:
            self.live -= entry[0]

    def __torch_dispatch__(  # type: ignore[override]
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self.track(out)
        return out


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

    Raises:
        InputSizeError: the network cannot run on ``input_shape`` (the rule the server's 422
            and the client's own check share).
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
    weights = list(swapped.values()) if on_meta else [*model.parameters(), *model.buffers()]
    live = _LiveStorage(ignore=weights)
    live.track(x)
    try:
        for i, (name, layer) in enumerate(zip(model.layer_names, model.layers, strict=True)):
            current[0] = i
            in_bytes = _nbytes(x)
            # The input is alive (held here as the engine holds it) throughout the layer.
            live.reset_peak()
            with live:
                if on_meta:
                    prefix = f"layers.{i}."
                    local = {
                        k[len(prefix) :]: v for k, v in swapped.items() if k.startswith(prefix)
                    }
                    x = torch.func.functional_call(layer, local, (x,))
                else:
                    x = layer(x)
            live.track(x)  # a layer that returns its input untouched runs no op
            out_bytes = _nbytes(x)
            # The leaf modules' figure stays a floor: it counts the input twice where a leaf
            # reads it, which the estimator's CPU calibration (tests/hapi_core) was made on.
            activation = max(in_bytes + max(out_bytes, inner_peak.get(i, 0)), live.peak)
            layers.append(
                LayerProfile(
                    name=name,
                    output_shape=tuple(x.shape[1:]),
                    output_bytes_per_sample=out_bytes,
                    activation_bytes_per_sample=activation,
                    weight_bytes=_param_bytes(layer),
                )
            )
    except torch.OutOfMemoryError:
        raise  # a real pass on a device too small: not the input size's fault
    # A crop too small for the network's pooling (RuntimeError), or not the one size a ViT's
    # position embedding takes (torch._assert's AssertionError).
    except (RuntimeError, AssertionError) as exc:
        crop = model.transform.crop
        raise InputSizeError(
            f"{model.arch} cannot run on {shape[1]}x{shape[2]} inputs (its own transform crops "
            f"{crop}x{crop}): {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
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
