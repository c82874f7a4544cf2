"""Registry, layer counts and the exactness of every split of every model."""

from __future__ import annotations

import hapi_models as hm
import pytest
import torch

from tests.hapi_models.split_exactness import assert_exact_at_every_split_point

# Table 5.2 of the thesis, with AlexNet and VGG11 under the one consistent counting rule
# (the table prints 22 and 28; see hapi_models.zoo.plain_cnns).
EXPECTED = {
    "alexnet": (21, 17),
    "resnet18": (14, 11),
    "resnet50": (22, 20),
    "vgg11": (29, 25),
    "vgg19": (45, 36),
    "densenet121": (22, 20),
    "efficientnet_lite0": (22, 18),
}


def test_the_thesis_networks_keep_their_hand_cut_layers() -> None:
    # Table 5.2's numbering: every result in the README stays comparable.
    assert hm.thesis_models() == sorted(EXPECTED)
    assert all(hm.get_spec(name).family == "thesis" for name in EXPECTED)


def test_registry_lists_every_torchvision_classification_network() -> None:
    import torchvision.models

    listed = hm.list_models()
    assert listed == sorted(listed)
    assert set(torchvision.models.list_models(module=torchvision.models)) <= set(listed)
    assert set(EXPECTED) <= set(listed)


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(hm.UnknownModelError, match="resnet18"):
        hm.get_model("resnet19")


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_num_classes_must_be_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match="num_classes"):
        hm.get_model("alexnet", num_classes=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_layer_counts_and_freeze_indices(name: str) -> None:
    model = hm.get_model(name, num_classes=10)
    layers, freeze = EXPECTED[name]
    assert model.num_layers == layers == hm.get_spec(name).num_layers
    assert model.default_freeze_index == freeze
    assert len(model.layer_names) == layers


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_split_is_exact(name: str) -> None:
    torch.manual_seed(0)
    model = hm.get_model(name, num_classes=7)
    x = torch.randn(2, 3, 64, 64)
    full = assert_exact_at_every_split_point(model, x, rtol=1e-5, atol=1e-6)
    assert full.shape == (2, 7)


def test_split_matches_the_torchvision_forward() -> None:
    """The layer list is the torchvision network itself, not a re-implementation."""
    from hapi_models.zoo.resnet import _layers
    from torchvision.models import resnet18

    torch.manual_seed(1)
    net = resnet18(num_classes=5).eval()
    model = hm.SplittableModel(
        "resnet18",
        _layers(net, hm.get_spec("resnet18").layer_names),
        default_freeze_index=11,
        transform=hm.InputTransform(),
        num_classes=5,
    ).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), net(x), rtol=0, atol=0)


@pytest.mark.parametrize("split", [-1, 15, 100])
def test_split_index_out_of_range(split: int) -> None:
    model = hm.get_model("resnet18", num_classes=10)
    with pytest.raises(hm.SplitIndexError, match=r"\[0, 14\]"):
        model.head(split)
    with pytest.raises(hm.SplitIndexError):
        model.tail(split)


def test_head_and_tail_share_parameters() -> None:
    model = hm.get_model("alexnet", num_classes=10)
    head_params = {id(p) for p in model.head(5).parameters()}
    assert head_params <= {id(p) for p in model.parameters()}


def test_freeze_sets_requires_grad_by_layer() -> None:
    model = hm.get_model("resnet18", num_classes=10)
    model.freeze()
    for i, layer in enumerate(model.layers):
        for p in layer.parameters():
            assert p.requires_grad == (i >= 11)


def test_efficientnet_pretrained_weights_classify_a_real_photo() -> None:
    """The packaged ImageNet weights give ImageNet predictions on a bundled photo."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    model = hm.get_model("efficientnet_lite0", num_classes=1000, weights="imagenet")
    china = Image.fromarray(load_sample_images().images[0])
    with torch.inference_mode():
        probs = model(model.transform(china).unsqueeze(0)).softmax(-1)[0]
    top5 = probs.topk(5).indices.tolist()
    # 442 "bell cote", 538 "dome", 698 "palace" (ImageNet-1k indices)
    assert {442, 538, 698} & set(top5), top5


def test_torchvision_archs_refuse_pretrained() -> None:
    with pytest.raises(hm.PretrainedWeightsUnavailableError, match="offline"):
        hm.get_model("resnet18", weights="imagenet")
