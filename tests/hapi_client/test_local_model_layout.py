"""The client's frozen layers run in the layout a server would choose for them (issue 30):
BASELINE computes HAPI's head locally and must not be handicapped by an NCHW-only forward."""

from __future__ import annotations

from collections.abc import Callable

import hapi_models
import pytest
import torch
from hapi_models import layout

from hapi_client import frozen_layers
from hapi_client.feature_dataset import LocalModel


def _channels_last_measures_faster(
    head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> tuple[float, torch.Tensor]:
    return (1.0 if x.is_contiguous(memory_format=torch.channels_last) else 2.0), head(x)


def test_baseline_runs_its_frozen_layers_in_the_chosen_layout_and_its_tail_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(frozen_layers, "LAYOUTS", hapi_models.LayoutChooser())
    # The layers as built, so that hooks on them see their inputs (a folded copy runs no hook).
    monkeypatch.setattr(frozen_layers, "FOLDER", hapi_models.BatchNormFolder(enabled=False))
    monkeypatch.setattr(layout, "_timed", _channels_last_measures_faster)
    torch.manual_seed(0)
    net = hapi_models.get_model("resnet18", num_classes=3)
    freeze = net.default_freeze_index
    local = LocalModel(net, 0, freeze).eval()  # split 0: BASELINE
    inputs: dict[str, list[torch.Tensor]] = {"frozen": [], "tail": []}
    net.layers[0].register_forward_pre_hook(lambda m, a: inputs["frozen"].append(a[0]))
    net.layers[freeze].register_forward_pre_hook(lambda m, a: inputs["tail"].append(a[0]))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    local(x)  # the first batch measures
    inputs["frozen"].clear()
    inputs["tail"].clear()
    got = local(x)
    ((frozen,), (tail,)) = inputs["frozen"], inputs["tail"]
    assert frozen.is_contiguous(memory_format=torch.channels_last) and not frozen.is_contiguous()
    assert tail.is_contiguous()  # the trainable layers train on the kernels they always did
    expected = x
    for layer in net.layers:
        expected = layer(expected)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    got.sum().backward()  # the trainable layers still learn through it
    assert all(p.grad is not None for p in local.trainable_parameters())
