"""Architectures from the ``hapi.models`` entry points: fakes of every failure, and the real
example plugin (examples/hapi-model-plugin) installed in the venv."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import hapi_models as hm
import pytest
import torch
from hapi_models import plugins, registry
from torch import nn

MODULE = "hapi_fake_plugins"


def _tiny(num_classes: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, num_classes),
    )


def _not_a_module(num_classes: int) -> object:
    return {"classes": num_classes}


def _raising_builder(num_classes: int) -> nn.Module:
    raise RuntimeError("no such layer in this build")


def _hand_cut(name: str) -> hm.ModelSpec:
    """A ModelSpec cut by hand, as a plugin may ship one."""
    transform = hm.InputTransform(resize=32, crop=32)

    def build(num_classes: int, pretrained: bool) -> hm.SplittableModel:
        net = _tiny(num_classes)
        return hm.SplittableModel(
            name,
            [(str(i), layer) for i, layer in enumerate(net)],
            default_freeze_index=4,
            transform=transform,
            num_classes=num_classes,
        )

    layout = hm.SplitLayout(("0", "1", "2", "3", "4"), 4)
    return hm.ModelSpec(name, build, layout, transform, False, "hand-cut test network")


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., None]:
    """``install(name=value, ...)``: discover exactly these entry points into a copy of the
    registry (the process's own registry is left as it was)."""
    hm.list_models()  # the real discovery first: what the copies start from
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_BROKEN", dict(registry._BROKEN))
    module = types.ModuleType(MODULE)
    module.tiny = _tiny  # type: ignore[attr-defined]
    module.not_a_module = _not_a_module  # type: ignore[attr-defined]
    module.raising_builder = _raising_builder  # type: ignore[attr-defined]
    module.handcut = _hand_cut("handcut")  # type: ignore[attr-defined]
    module.misnamed = _hand_cut("another_name")  # type: ignore[attr-defined]
    module.number = 42  # type: ignore[attr-defined]
    module.bad_transform = _tiny_with(hapi_transform="64px")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, module)
    # A plugin module whose import fails, as one needing a missing driver would.
    (tmp_path / "hapi_fake_broken.py").write_text(
        "raise ImportError('libfoo.so.1: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def run(**entries: str) -> None:
        points = metadata.EntryPoints(
            metadata.EntryPoint(name, value, plugins.GROUP) for name, value in entries.items()
        )

        def entry_points(**selection: str) -> metadata.EntryPoints:
            assert selection == {"group": plugins.GROUP}
            return points

        monkeypatch.setattr(metadata, "entry_points", entry_points)
        plugins.register_plugins()

    return run


def _tiny_with(**attributes: object) -> Callable[[int], nn.Module]:
    def build(num_classes: int) -> nn.Module:
        return _tiny(num_classes)

    for key, value in attributes.items():
        setattr(build, key, value)
    return build


@pytest.fixture
def registry_still_serves() -> Iterator[None]:
    yield
    model = hm.get_model("resnet18", num_classes=3)
    assert model.num_layers == hm.get_spec("resnet18").num_layers
    assert "tinycnn" in hm.list_models()


def test_a_builder_plugin_is_cut_at_its_graphs_split_points(install: Callable[..., None]) -> None:
    install(tinyplug=f"{MODULE}:tiny")
    spec = hm.get_spec("tinyplug")
    assert spec.family == "plugin:an unknown distribution"  # a fake entry point has no dist
    assert spec.layer_names == ("0", "1", "2", "3", "4")
    assert spec.default_freeze_index == 4  # the Linear stays trainable
    assert spec.transform == hm.InputTransform()  # ImageNet's, as none was given
    assert "tinyplug" in hm.list_models()
    model = hm.get_model("tinyplug", num_classes=5)
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 5)


def test_a_model_spec_plugin_is_registered_as_it_is(install: Callable[..., None]) -> None:
    install(handcut=f"{MODULE}:handcut")
    spec = hm.get_spec("handcut")
    assert spec.family == "plugin:an unknown distribution"
    assert spec.description == "hand-cut test network"
    model = hm.get_model("handcut", num_classes=2)
    assert model.num_layers == 5 and model.default_freeze_index == 4


@pytest.mark.usefixtures("registry_still_serves")
@pytest.mark.parametrize(
    ("value", "cause"),
    [
        ("hapi_fake_broken:build", r"raises on import: ImportError: libfoo\.so\.1"),
        (f"{MODULE}:missing", "raises on import: AttributeError"),
        (f"{MODULE}:number", "is a int, neither a ModelSpec nor a builder function"),
        (f"{MODULE}:misnamed", "holds a spec named 'another_name', not 'broken'"),
        (f"{MODULE}:bad_transform", "hapi_transform is not an InputTransform"),
    ],
    ids=["import-raises", "no-such-object", "not-callable", "misnamed-spec", "bad-transform"],
)
def test_a_plugin_that_cannot_load_is_a_plugin_error_naming_it(
    install: Callable[..., None], value: str, cause: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger=plugins.__name__):
        install(broken=value, tinyplug=f"{MODULE}:tiny")
    assert "plugin 'broken'" in caplog.text
    for ask in (hm.get_spec, hm.get_model):
        with pytest.raises(hm.PluginError, match=cause) as info:
            ask("broken")
        assert f"plugin 'broken' ({value}" in str(info.value)
    assert "broken" not in hm.list_models()
    assert hm.get_spec("tinyplug").num_layers == 5  # the good plugin beside it is served


@pytest.mark.usefixtures("registry_still_serves")
@pytest.mark.parametrize(
    ("value", "cause"),
    [
        (f"{MODULE}:not_a_module", "its builder returned a dict, not an nn.Module"),
        (f"{MODULE}:raising_builder", "its builder raised RuntimeError: no such layer"),
    ],
    ids=["not-a-module", "builder-raises"],
)
def test_a_builder_that_fails_is_a_plugin_error_when_asked_for(
    install: Callable[..., None], value: str, cause: str
) -> None:
    install(badbuild=value)
    # Registered (its builder runs only when the network is needed), refused on first use.
    with pytest.raises(hm.PluginError, match=cause):
        _ = hm.get_spec("badbuild").num_layers
    with pytest.raises(hm.PluginError, match=cause):
        hm.get_model("badbuild", num_classes=3)


@pytest.mark.usefixtures("registry_still_serves")
@pytest.mark.parametrize("name", ["Tiny-Net", "", "x" * 65, "tiny.net"])
def test_a_bad_name_is_ignored_with_an_error(
    install: Callable[..., None], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger=plugins.__name__):
        install(**{name: f"{MODULE}:tiny"})
    assert "names are 1-64 characters of [a-z0-9_]" in caplog.text
    if name:
        with pytest.raises(hm.UnknownModelError):
            hm.get_spec(name)


@pytest.mark.usefixtures("registry_still_serves")
@pytest.mark.parametrize("name", ["alexnet", "resnet18", "tinycnn"])
def test_a_name_the_registry_has_is_not_replaced(
    install: Callable[..., None], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    before = hm.get_spec(name)
    with caplog.at_level(logging.ERROR, logger=plugins.__name__):
        install(**{name: f"{MODULE}:tiny"})
    assert "the registry has an architecture of that name" in caplog.text
    assert hm.get_spec(name) is before


# The real example plugin, installed in the venv by `make install` (examples/hapi-model-plugin).


def test_the_example_plugin_is_installed_as_an_entry_point() -> None:
    found = {e.name: e for e in metadata.entry_points(group=plugins.GROUP)}
    assert found["tinycnn"].value == "hapi_tinycnn:build"
    spec = hm.get_spec("tinycnn")
    assert spec.family == "plugin:hapi-tinycnn"
    assert spec.transform == hm.InputTransform(resize=72, crop=64)
    assert "example plugin" in spec.description
    assert "tinycnn" in hm.list_models()


def test_the_example_plugin_splits_exactly_at_every_point() -> None:
    import hapi_tinycnn

    torch.manual_seed(0)
    model = hm.get_model("tinycnn", num_classes=5)
    native = hapi_tinycnn.build(5)
    native.load_state_dict({k: model.state_dict()[v] for k, v in model.native_keys.items()})
    native.eval()
    spec = hm.get_spec("tinycnn")
    assert tuple(model.layer_names) == spec.layer_names
    # Four blocks of four layers, the pooling and the flattening, then the classifier.
    assert model.num_layers == 19 and model.default_freeze_index == 18
    assert model.layer_names[-1] == "classifier"
    points = hm.split_points("tinycnn")
    assert [p.sample_shape for p in points][:2] == [(3, 64, 64), (16, 64, 64)]
    assert points[-2].sample_shape == (128,) and points[-1].sample_shape == (1000,)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        full = model(x)
        # The layers are the native modules, run in the native order on the same tensors.
        assert torch.equal(full, native(x))
        for split in range(model.num_layers + 1):
            assert torch.equal(model.tail(split)(model.head(split)(x)), full), split
