"""Exactness at every split point in O(L) layer runs, not O(L²).

Running ``tail(s)(head(s)(x))`` for every ``s`` runs the network ``L + 1`` times (96 s for
EfficientNet-V2-S in the suite). The same property follows from one pass:

* ``head(s)`` and ``tail(s)`` are the layers ``[0, s)`` and ``[s, L)`` themselves, in order
  (checked by identity), so ``head(s)(x)`` is the activation ``a_s`` that the pass records at
  split point ``s`` and ``tail(s)(a_s)`` is what the pass computes from there: ``a_L``;
* each step ``layers[s](a_s)`` is run on its own copy of ``a_s`` (an in-place layer cannot
  rewrite the recorded activation) and, where a reference network is given, on the reference's
  own activation at that split point, which it must reproduce; so an error is caught at the
  split point that makes it, not hidden in what follows;
* ``a_L`` equals ``model(x)`` (and the reference network's output).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import hapi_models as hm
import torch
from torch import fx, nn


def activations(model: hm.SplittableModel, x: torch.Tensor) -> list[torch.Tensor]:
    """``[a_0 = x, a_1, ..., a_L]``: every split point's activation, from one pass."""
    out = [x]
    for layer in model.layers:
        out.append(layer(out[-1].clone()))
    return out


def reference_activations(
    net: nn.Module, names: Sequence[str], x: torch.Tensor, tracer_kwargs: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """``net``'s activation at each node of ``names``, from one pass of torchvision's feature
    extractor, each copied as it is computed: a later in-place operation (RegNet's ReLU after
    its residual add) would otherwise rewrite what the extractor hands back."""
    from torchvision.models.feature_extraction import create_feature_extractor

    extractor = create_feature_extractor(
        net, return_nodes=list(names), tracer_kwargs=dict(tracer_kwargs)
    )
    with torch.no_grad():
        return _Recorder(extractor).record(x)


class _Recorder(fx.Interpreter):
    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        (output,) = (n for n in module.graph.nodes if n.op == "output")
        self._keys: dict[fx.Node, list[str]] = {}
        for key, node in output.args[0].items():
            self._keys.setdefault(node, []).append(key)
        self._recorded: dict[str, torch.Tensor] = {}

    def record(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.run(x)
        return self._recorded

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        for key in self._keys.get(n, ()):
            self._recorded[key] = result.clone()
        return result


def assert_exact_at_every_split_point(
    model: hm.SplittableModel,
    x: torch.Tensor,
    *,
    reference: Mapping[str, torch.Tensor] | None = None,
    reference_output: torch.Tensor | None = None,
    **tolerance: Any,
) -> torch.Tensor:
    """Check ``tail(s)(head(s)(x)) == model(x)`` for every split ``s``; return ``model(x)``.

    ``reference`` maps layer names to a reference network's activations at those split points
    (torchvision's feature extractor of the native network), ``reference_output`` is that
    network's output; ``tolerance`` goes to :func:`torch.testing.assert_close`.
    """
    layers = list(model.layers)
    count = len(layers)
    with torch.no_grad():
        acts = activations(model, x)
        full = model(x)
        torch.testing.assert_close(acts[-1], full, **tolerance, msg="the pass is not model(x)")
        if reference_output is not None:
            torch.testing.assert_close(
                full, reference_output, **tolerance, msg="model(x) is not the native network"
            )
        for split in range(count + 1):
            assert _same(model.head(split), layers[:split]), f"head({split}) is not layers[:s]"
            assert _same(model.tail(split), layers[split:]), f"tail({split}) is not layers[s:]"
        if reference is not None:
            assert set(model.layer_names) <= set(reference), "a split point has no reference"
            previous = x
            for split, (name, layer) in enumerate(zip(model.layer_names, layers, strict=True)):
                expected = reference[name]
                torch.testing.assert_close(
                    acts[split + 1], expected, **tolerance, msg=f"split point {split + 1} ({name})"
                )
                # The step from the reference's own activation: no error carried from before.
                torch.testing.assert_close(
                    layer(previous.clone()), expected, **tolerance, msg=f"step {split} ({name})"
                )
                previous = expected
    return full


def _same(sequence: nn.Sequential, layers: list[nn.Module]) -> bool:
    children = list(sequence)
    return len(children) == len(layers) and all(
        a is b for a, b in zip(children, layers, strict=True)
    )
