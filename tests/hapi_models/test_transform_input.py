"""GoogLeNet's and Inception-v3's transform_input follows the checkpoint, as torchvision's rule.

torchvision builds them with it on for its own pretrained weights and off otherwise; HAPI used
to build them with it always on, so a checkpoint of ``googlenet(weights=None)`` gave features
0.57-0.61 off (relative) at every split point, silently.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hapi_models as hm
import pytest
import safetensors.torch
import torch
import torchvision.models as tvm
from torch import nn
from torchvision.models.feature_extraction import create_feature_extractor

SIZE = {"googlenet": 64, "inception_v3": 96}
# The same modules, weights and inputs in one process: equal to rounding.
CLOSE = {"rtol": 1e-5, "atol": 1e-5}


def _native(arch: str, *, aux_logits: bool, transform_input: bool) -> nn.Module:
    torch.manual_seed(5)
    return tvm.get_model(
        arch,
        weights=None,
        aux_logits=aux_logits,
        transform_input=transform_input,
        init_weights=False,
    ).eval()


def _assert_same_features(model: hm.SplittableModel, native: nn.Module, arch: str) -> None:
    """At a split point in the middle and at the output, against torchvision's own network."""
    x = torch.randn(2, 3, SIZE[arch], SIZE[arch], generator=torch.Generator().manual_seed(0))
    split = model.num_layers // 2
    name = model.layer_names[split - 1]
    extractor = create_feature_extractor(native, return_nodes=[name]).eval()
    with torch.no_grad():
        torch.testing.assert_close(model.head(split)(x), extractor(x)[name], **CLOSE)
        torch.testing.assert_close(model(x), native(x), **CLOSE)


@pytest.mark.parametrize(
    ("arch", "aux_logits"), [("googlenet", True), ("googlenet", False), ("inception_v3", True)]
)
def test_a_checkpoint_trained_without_transform_input_gives_its_features(
    arch: str, aux_logits: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    native = _native(arch, aux_logits=aux_logits, transform_input=False)
    path = tmp_path / f"{arch}.pth"
    torch.save(native.state_dict(), path)
    with caplog.at_level(logging.WARNING, logger="hapi_models"):
        model = hm.import_weights(arch, hm.read_checkpoint(path))
    said = caplog.text
    assert "transform_input off" in said and "transform_input=True" in said
    assert ("auxiliary classifiers" in said) is aux_logits
    _assert_same_features(model, native, arch)
    # What the server builds from the stored weights runs the same network.
    stored = hm.get_model(arch, num_classes=1000, weights=hm.weights_to_bytes(model))
    _assert_same_features(stored, native, arch)


def test_transform_input_is_a_stated_option(tmp_path: Path) -> None:
    # A model fine-tuned from torchvision's weights was trained with it on: the caller says so.
    native = _native("googlenet", aux_logits=False, transform_input=True)
    path = tmp_path / "googlenet.pth"
    torch.save(native.state_dict(), path)
    model = hm.import_weights("googlenet", hm.read_checkpoint(path), transform_input=True)
    _assert_same_features(model, native, "googlenet")
    stored = hm.get_model("googlenet", weights=hm.weights_to_bytes(model))
    _assert_same_features(stored, native, "googlenet")
    with pytest.raises(hm.WeightsError, match="no transform_input"):
        hm.import_weights("resnet18", tvm.resnet18().state_dict(), transform_input=True)


def test_torchvision_weights_turn_transform_input_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torchvision's own file (aux heads included), put into the hub cache: no network.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    native = _native("googlenet", aux_logits=True, transform_input=True)
    torch.save(native.state_dict(), cache / Path(tvm.GoogLeNet_Weights.DEFAULT.url).name)
    model = hm.import_weights("googlenet", hm.torchvision_weights("googlenet", progress=False))
    _assert_same_features(model, native, "googlenet")


def test_a_random_initialisation_has_transform_input_off() -> None:
    # As torchvision's googlenet(weights=None): the rescale is the identity.
    model = hm.get_model("googlenet", num_classes=10)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model.layers[0](x), x, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["googlenet", "inception_v3"])
def test_weights_stored_before_the_rescale_travelled_load_with_it_on(
    arch: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Uploads made when HAPI built these networks with transform_input=True always: their
    # blobs hold every weight but no input_rescale buffers.
    native = _native(arch, aux_logits=False, transform_input=True)
    model = hm.import_weights(arch, native.state_dict(), transform_input=True)
    old = {k: v for k, v in model.state_dict().items() if "input_rescale" not in k}
    assert len(old) == len(model.state_dict()) - 2
    blob = save_file_bytes(old)
    with caplog.at_level(logging.WARNING, logger="hapi_models"):
        loaded = hm.get_model(arch, num_classes=1000, weights=blob)
        again = hm.get_model(arch, num_classes=1000, weights=blob)
    _assert_same_features(loaded, native, arch)
    _assert_same_features(again, native, arch)
    said = [r.getMessage() for r in caplog.records if "transform_input" in r.getMessage()]
    assert len(said) == 1 and "with it on" in said[0], said
    # Half a rescale is not an old upload: still refused.
    (partial := dict(old))["layers.0.input_rescale.scale"] = torch.ones(3)
    with pytest.raises(hm.WeightsError, match="do not fit"):
        hm.get_model(arch, num_classes=1000, weights=save_file_bytes(partial))


def save_file_bytes(state: dict[str, torch.Tensor]) -> bytes:
    return safetensors.torch.save({k: v.contiguous() for k, v in state.items()})
