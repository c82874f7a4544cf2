"""Batch norms folded into the convolutions before them, for layers that only infer.

A frozen head in eval mode runs each batch norm as a separate pass over its convolution's
output: ``y = (conv(x) - mean) / sqrt(var + eps) * gamma + beta``, an affine map per channel
that the convolution's own weights and bias can hold. Folded, the pass is gone. On
EfficientNet-Lite0's head to split 9 (batch 32, one thread of a 2-core AMD EPYC, channels_last
input) the batch norms were a third of the forward's CPU time, and folding took it from 28.9 to
18.0 ms per image (issue 30). The features are equal to float rounding (1.3e-6 relative there).

Which convolution feeds which batch norm is read from a forward of one sample through a private
copy of the layer (hooks on the shared modules would run in every request's forward), not from
the module tree: a network may call its modules in any order, and torch.fx cannot trace every
network the zoo holds (timm's ``Conv2dSame`` pads by the input's size). A pair is folded only
when the norm's input is the very tensor the convolution returned, unmodified (its version
counter unchanged), both ran once, the norm is in eval mode with running statistics, and the
norm is a plain ``BatchNorm2d`` or timm's ``BatchNormAct2d`` (whose activation stays). Two
things a forward cannot see, the convolution's output also used elsewhere, or a norm subclass
that computes otherwise, are caught by comparing the folded layer's output with the original's
on the same sample: a layer that differs is run unfolded.

``torch.fx.experimental.optimization.fuse`` does the same for traceable modules whose norm is an
exact ``nn.BatchNorm2d``; it neither traces timm's networks nor folds ``BatchNormAct2d``, hence
this module. ``torch.nn.utils.fusion.fuse_conv_bn_weights`` computes the folded weights.

A folded layer is a copy that shares every tensor of the original except the folded
convolutions' weights and biases (so it holds at most one more copy of those), made once per
layer and kept while the layer lives; hooks registered on the original do not run on it. A layer whose parameters change in place afterwards
(``load_state_dict`` copies into them) is folded again on its next use.
"""

from __future__ import annotations

import copy
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_weights

__all__ = ["BatchNormFolder", "fold_batch_norms", "folded_parameter_bytes"]

log = logging.getLogger(__name__)

#: The folded layer's output must match the original's to this relative norm: folding moves
#: float32 features by about 1e-6; a wrong fold moves them by the whole norm's effect (> 1e-2).
_MATCH = 1e-4


def fold_batch_norms(layer: nn.Module, probe: torch.Tensor) -> nn.Module:
    """``layer`` with each batch norm that directly follows a convolution folded into it, a
    copy; ``layer`` itself when nothing folds or the folded copy's output differs. ``probe``:
    an input of ``layer`` (one sample is enough), run twice."""
    # The pairs are read from the copy, never from ``layer``: its modules are shared with every
    # thread that runs the model, and hooks on them would fire in those threads' forwards.
    folded = _private_copy(layer)
    pairs, expected = _conv_norm_pairs(folded, probe)
    if not pairs:
        return layer
    for conv_name, norm_name in pairs:
        conv = folded.get_submodule(conv_name)
        norm = folded.get_submodule(norm_name)
        assert isinstance(conv, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d)
        assert norm.running_mean is not None and norm.running_var is not None
        # Plain tensors even inside inference_mode: the folded layer may later run with grad
        # enabled (a client's frozen layers), where inference tensors are refused.
        with torch.inference_mode(False), torch.no_grad():
            weight, bias = fuse_conv_bn_weights(
                conv.weight,
                conv.bias,
                norm.running_mean,
                norm.running_var,
                norm.eps,
                norm.weight,
                norm.bias,
            )
        conv.weight, conv.bias = weight, bias
        _replace(folded, norm_name, _after_norm(norm))
    with torch.no_grad():
        got = folded(probe)
    if not _matches(got, expected):
        log.warning(
            "folding the batch norms of %s changed its output: it runs unfolded",
            type(layer).__name__,
        )
        return layer
    return folded


def _private_copy(layer: nn.Module) -> nn.Module:
    """``layer``'s modules copied, every tensor shared (the memo maps each to itself), and no
    hook: one registered on the original meanwhile (another request's memory probe, say) must
    not run, nor outlive its registration, on the copy."""
    memo: dict[int, object] = {id(t): t for t in (*layer.parameters(), *layer.buffers())}
    copied = copy.deepcopy(layer, memo)
    for module in copied.modules():
        for hooks in (
            module._forward_hooks,
            module._forward_hooks_with_kwargs,
            module._forward_hooks_always_called,
            module._forward_pre_hooks,
            module._forward_pre_hooks_with_kwargs,
        ):
            hooks.clear()
    return copied


def folded_parameter_bytes(layers: Sequence[nn.Module], x: torch.Tensor) -> int:
    """The bytes the folded copies of ``layers`` (in eval mode, run in a row on ``x``) add:
    their folded convolutions' weights and biases. Layers and ``x`` may be on the meta device,
    where nothing is computed."""
    total = 0
    for _key, unit in _units(layers):
        pairs, x = _conv_norm_pairs(unit, x)
        for conv_name, _norm in pairs:
            conv = unit.get_submodule(conv_name)
            assert isinstance(conv, nn.Conv2d)
            total += (conv.weight.numel() + conv.out_channels) * conv.weight.element_size()
    return total


@dataclass
class _Folded:
    versions: tuple[int, ...]
    layer: nn.Module | None
    """The folded copy; None when nothing folded (the key itself: a value holding its key
    would keep it alive)."""


class BatchNormFolder:
    """Each layer's folded copy (:func:`fold_batch_norms`), made on first use and kept while
    the layer lives; shared by every request (thread) that runs those layers."""

    def __init__(
        self,
        enabled: bool = True,
        *,
        lock: Callable[[], AbstractContextManager[Any]] = threading.Lock,
    ) -> None:
        """``lock``: makes the folder's locks; a host whose threads eventlet patched (the Swift
        proxy) passes one between OS threads, since a fold holds its lock while other pool
        threads ask for it (a green lock contended from two of them fails)."""
        self.enabled = enabled
        self._lock = lock()
        self._folding = lock()
        self._folded: weakref.WeakKeyDictionary[nn.Module, _Folded] = weakref.WeakKeyDictionary()

    def layers(self, layers: Sequence[nn.Module], x: torch.Tensor) -> nn.Sequential:
        """``layers`` in a row, each folded where it can be (a convolution layer and the norm
        layer after it together); ``x``: their input batch, whose first sample makes the folds
        a layer lacks."""
        return nn.Sequential(*(module for _, module in self.runs(layers, x)))

    def runs(self, layers: Sequence[nn.Module], x: torch.Tensor) -> list[tuple[int, nn.Module]]:
        """What :meth:`layers` runs, one entry per module: how many of ``layers`` it stands for
        (2 for a convolution layer folded with the norm layer after it) and the module. A
        per-layer timing times these, as the head runs them."""
        if not self.enabled:
            return [(1, layer) for layer in layers]
        out: list[nn.Module] = []
        counts: list[int] = []
        probe: torch.Tensor | None = None
        units = _units(layers)
        for i, (key, unit) in enumerate(units):
            folded = self._kept(key, unit)
            if folded is None:
                if probe is None:
                    # The sample through the layers before this one, as they now run.
                    probe = x[:1]
                    with torch.no_grad():
                        for before in out:
                            probe = before(probe)
                folded = self._fold(key, unit, probe)
            out.append(folded)
            counts.append(2 if key is not unit else 1)
            if probe is not None and i + 1 < len(units):
                with torch.no_grad():
                    probe = folded(probe)
        return list(zip(counts, out, strict=True))

    def _kept(self, key: nn.Module, unit: nn.Module) -> nn.Module | None:
        with self._lock:
            kept = self._folded.get(key)
        if kept is None or kept.versions != _versions(unit) or unit.training:
            return None
        return unit if kept.layer is None else kept.layer

    def _fold(self, key: nn.Module, unit: nn.Module, probe: torch.Tensor) -> nn.Module:
        if unit.training:
            return unit  # its batch norms normalise by the batch: nothing to fold
        # One fold at a time: the first requests of a model arrive together, and each would
        # copy and fold the same layers.
        with self._folding:
            kept = self._kept(key, unit)
            if kept is not None:
                return kept
            folded = fold_batch_norms(unit, probe)
            with self._lock:
                self._folded[key] = _Folded(_versions(unit), None if folded is unit else folded)
        return folded


def _units(layers: Sequence[nn.Module]) -> list[tuple[nn.Module, nn.Module]]:
    """What is folded at once, with the module its fold is kept under: each layer alone, but a
    convolution layer and the norm layer after it together, kept under the norm (ResNet's stem
    is a convolution layer and a norm layer). VGG-BN's layers wrap each module in a layer of
    its own and are not folded."""
    units: list[tuple[nn.Module, nn.Module]] = []
    i = 0
    while i < len(layers):
        layer = layers[i]
        after = layers[i + 1] if i + 1 < len(layers) else None
        if isinstance(layer, nn.Conv2d) and after is not None and _foldable_norm(after):
            pair = nn.Sequential(layer, after)
            pair.training = after.training  # its own flag only: the layers' modes stay theirs
            units.append((after, pair))
            i += 2
        else:
            units.append((layer, layer))
            i += 1
    return units


def _versions(layer: nn.Module) -> tuple[int, ...]:
    """In-place changes of the layer's tensors since a fold (``load_state_dict`` copies in)."""
    tensors = (*layer.parameters(), *layer.buffers())
    return tuple(-1 if t.is_inference() else t._version for t in tensors)


def _conv_norm_pairs(
    layer: nn.Module, probe: torch.Tensor
) -> tuple[list[tuple[str, str]], torch.Tensor]:
    """The (convolution, norm) submodule names that fold, from one forward; and its output."""
    names = {module: name for name, module in layer.named_modules(remove_duplicate=False)}
    calls: dict[str, int] = {}
    returned: dict[int, tuple[str, torch.Tensor, int]] = {}
    fed: dict[str, tuple[str, torch.Tensor]] = {}

    def after_conv(module: nn.Module, _args: object, output: object) -> None:
        name = names[module]
        calls[name] = calls.get(name, 0) + 1
        if isinstance(output, torch.Tensor):
            # The tensor is held, so that its id cannot be reused by another within the forward.
            returned[id(output)] = (name, output, output._version)

    def before_norm(module: nn.Module, args: tuple[object, ...]) -> None:
        name = names[module]
        calls[name] = calls.get(name, 0) + 1
        x = args[0] if args else None
        source = returned.get(id(x)) if isinstance(x, torch.Tensor) else None
        if source is not None and source[1] is x and x._version == source[2]:
            fed[name] = (source[0], x)

    handles = []
    for module, name in names.items():
        if isinstance(module, nn.Conv2d) and name:
            handles.append(module.register_forward_hook(after_conv))
        elif _foldable_norm(module) and name:
            handles.append(module.register_forward_pre_hook(before_norm))
    try:
        # Outside inference mode: its tensors keep no version counter to compare.
        with torch.inference_mode(False), torch.no_grad():
            output = layer(probe.clone())
    finally:
        for handle in handles:
            handle.remove()
    pairs = [
        (conv, norm)
        for norm, (conv, _x) in fed.items()
        if calls.get(norm) == 1 and calls.get(conv) == 1
    ]
    return pairs, output


def _foldable_norm(module: nn.Module) -> bool:
    if not isinstance(module, nn.BatchNorm2d) or module.training:
        return False
    if module.running_mean is None or module.running_var is None:
        return False
    # A subclass may compute otherwise: only the two whose arithmetic is known fold.
    return type(module) is nn.BatchNorm2d or _is_norm_act(module)


def _is_norm_act(module: nn.Module) -> bool:
    """timm's ``BatchNormAct2d``: the norm, then ``drop``, then ``act``."""
    return (
        type(module).__name__ == "BatchNormAct2d"
        and isinstance(getattr(module, "drop", None), nn.Module)
        and isinstance(getattr(module, "act", None), nn.Module)
    )


def _after_norm(norm: nn.BatchNorm2d) -> nn.Module:
    """What is left of a folded norm: nothing, or timm's dropout and activation after it."""
    drop, act = getattr(norm, "drop", None), getattr(norm, "act", None)
    if _is_norm_act(norm) and isinstance(drop, nn.Module) and isinstance(act, nn.Module):
        return nn.Sequential(drop, act)
    return nn.Identity()


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _matches(got: object, expected: object) -> bool:
    if not isinstance(got, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return False
    if got.shape != expected.shape or not got.dtype.is_floating_point:
        return bool(torch.equal(got, expected))
    scale = float(expected.float().norm())
    difference = float((got.float() - expected.float()).norm())
    return difference <= _MATCH * max(scale, 1e-12)
