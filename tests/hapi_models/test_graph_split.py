"""Networks cut at their graph's split points: every torchvision classification network, timm's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hapi_models as hm
import pytest
import torch
import torchvision.models
from torch import nn

from tests.hapi_models.split_exactness import (
    assert_exact_at_every_split_point,
    reference_activations,
)

TORCHVISION = torchvision.models.list_models(module=torchvision.models)
# The modern backbones, the bench scenario's: each split point checked for exactness.
MODERN = [
    "vit_b_16",
    "convnext_tiny",
    "swin_t",
    "efficientnet_v2_s",
    "regnet_y_400mf",
    "mobilenet_v3_small",
]
TIMM = ["timm/vit_tiny_patch16_224", "timm/convnext_atto", "timm/efficientnet_b0"]
# The smallest input each network runs at that still exercises every layer: a ViT's position
# embedding fixes its size; convolutional networks and Swin run at 64 pixels.
FIXED_SIZE = {"vit_b_16": 224, "timm/vit_tiny_patch16_224": 224}


@pytest.mark.parametrize("arch", TORCHVISION)
def test_every_torchvision_network_yields_split_points(arch: str) -> None:
    spec = hm.get_spec(arch)
    points = hm.split_points(arch)
    assert len(points) == spec.num_layers + 1 >= 3
    assert [p.name for p in points[1:]] == list(spec.layer_names)
    assert points[0].sample_shape == spec.transform.input_shape
    # The default freeze index leaves the classifier (the last linear layer) trainable.
    assert 0 < spec.default_freeze_index < spec.num_layers
    assert points[-1].sample_shape == (1000,)


def _native(arch: str, model: hm.SplittableModel) -> tuple[nn.Module, dict[str, Any]]:
    """The library's own network with ``model``'s weights, and the tracer options it needs."""
    if arch.startswith("timm/"):
        import timm
        from timm.models import get_notrace_functions, get_notrace_modules

        net = timm.create_model(arch.removeprefix("timm/"), num_classes=model.num_classes)
        kwargs = {
            "leaf_modules": list(get_notrace_modules()),
            "autowrap_functions": list(get_notrace_functions()),
        }
    else:
        net, kwargs = torchvision.models.get_model(arch, num_classes=model.num_classes), {}
    state = model.state_dict()
    net.load_state_dict({native: state[ours] for native, ours in model.native_keys.items()})
    return net.eval(), kwargs


@pytest.mark.parametrize("arch", [*MODERN, *TIMM])
def test_tail_of_head_is_the_network_at_every_split_point(arch: str) -> None:
    torch.manual_seed(0)
    model = hm.get_model(arch, num_classes=7)
    size = FIXED_SIZE.get(arch, 64)
    x = torch.randn(2, 3, size, size)
    # The reference: the library's own network, every split point's activation in one pass.
    net, tracer_kwargs = _native(arch, model)
    reference = reference_activations(net, model.layer_names, x, tracer_kwargs)
    with torch.no_grad():
        expected = net(x)
    full = assert_exact_at_every_split_point(
        model, x, reference=reference, reference_output=expected
    )
    assert full.shape == (2, 7)


def test_split_points_are_module_paths_and_the_classifier_is_trainable() -> None:
    spec = hm.get_spec("vit_b_16")
    assert spec.layer_names[spec.default_freeze_index] == "heads.head"
    assert "encoder.layers.encoder_layer_11.add_1" in spec.layer_names
    model = hm.get_model("mobilenet_v3_small", num_classes=4)
    model.freeze()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith(f"layers.{model.num_layers - 1}.") for n in trainable)


# SqueezeNet's classifier is a 1x1 convolution, followed by a pool and a flatten.
@pytest.mark.parametrize("arch", ["regnet_y_400mf", "squeezenet1_1"])
def test_a_new_head_replaces_the_classifier(arch: str) -> None:
    model = hm.get_model(arch, num_classes=1000)
    model.replace_classifier(3, seed=1)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    again = hm.get_model(arch, num_classes=1000)
    again.replace_classifier(3, seed=1)
    head = model.default_freeze_index
    torch.testing.assert_close(model.layers[head].state_dict(), again.layers[head].state_dict())


@pytest.mark.parametrize("arch", ["mobilenet_v3_small", "vit_b_16"])
def test_torchvision_state_dicts_load_by_native_names(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(3)
    native = torchvision.models.get_model(arch, weights=None).eval()
    path = tmp_path / f"{arch}.pth"
    torch.save(native.state_dict(), path)
    model = hm.import_weights(arch, hm.read_checkpoint(path))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), native(x))


def test_auxiliary_classifiers_in_torchvision_files_are_dropped(tmp_path: Path) -> None:
    # torchvision's Inception-v3 file holds AuxLogits, which the eval graph never runs.
    torch.manual_seed(4)
    native = torchvision.models.inception_v3(
        weights=None, aux_logits=True, init_weights=False, transform_input=True
    ).eval()
    path = tmp_path / "inception.pth"
    torch.save(native.state_dict(), path)
    model = hm.import_weights("inception_v3", hm.read_checkpoint(path), transform_input=True)
    x = torch.randn(1, 3, 299, 299)
    with torch.no_grad():
        torch.testing.assert_close(model(x), native(x))


def test_weights_of_another_architecture_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "regnet.pth"
    torch.save(torchvision.models.regnet_y_400mf().state_dict(), path)
    with pytest.raises(hm.WeightsError, match="does not fit mobilenet_v3_small"):
        hm.import_weights("mobilenet_v3_small", hm.read_checkpoint(path))


def test_unknown_names_are_refused_with_the_registry() -> None:
    with pytest.raises(hm.UnknownModelError, match="vit_b_16"):
        hm.get_spec("vit_b_17")
    with pytest.raises(hm.UnknownModelError):
        hm.get_spec("timm/not_a_timm_model")
    # A tag timm does not know is an unknown name too (it was timm's RuntimeError), naming
    # the tags it knows.
    with pytest.raises(hm.UnknownModelError, match=r"no tag 'bad_tag'.*timm/resnet18d\.ra2_in1k"):
        hm.get_spec("timm/resnet18d.bad_tag")


class _TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class _DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # control flow on values: torch.fx cannot trace it
            return x
        return -x


class _TupleOut(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


@pytest.mark.parametrize(
    ("net", "cause"),
    [
        (_TwoInputs(), "argument 'y' beside the image"),
        (_DataDependent(), "torch.fx cannot trace it"),
        (_TupleOut(), "not one tensor"),
    ],
)
def test_networks_that_cannot_be_cut_are_refused_with_the_cause(net: nn.Module, cause: str) -> None:
    with pytest.raises(hm.UntraceableModelError, match=cause):
        hm.split_graph(net, "custom", (3, 8, 8))


def test_a_residual_block_is_never_cut_inside() -> None:
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.fc = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 3, 1), nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.b(torch.relu(self.a(x))) + x  # x stays alive across a and b
            return self.fc(y.mean((2, 3)))

    cut = hm.split_graph(Residual(), "residual", (3, 8, 8))
    assert cut.names == ("add", "mean", "fc")
    assert cut.sample_shapes == ((3, 8, 8), (3,), (2,))
    assert cut.classifier_index == 2


def test_regnets_build_on_the_meta_device_once_listed() -> None:
    """torchvision's RegNet builder computes its stage widths with tensors; once the registry
    has listed torchvision, that runs on the CPU and the network itself on meta (listing every
    network no longer initialises RegNetY-128GF's 645 million weights on the CPU)."""
    from torchvision import models

    hm.list_models()
    with torch.device("meta"):
        net = models.get_model("regnet_y_128gf", weights=None)
    assert {p.device.type for p in net.parameters()} == {"meta"}
    with torch.device("cpu"):
        small = models.get_model("regnet_y_400mf", weights=None)
    assert {p.device.type for p in small.parameters()} == {"cpu"}
