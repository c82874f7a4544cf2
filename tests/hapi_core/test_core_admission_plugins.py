"""Admission of a broken architecture plugin (unit): the server and the filter answer through
:func:`hapi_core.admission.admit_model`, so a plugin that raises on import or builds something
that is not a network is a 422 naming the plugin, and the other architectures are admitted."""

from __future__ import annotations

import sys
import types
from importlib import metadata
from pathlib import Path

import hapi_models
import pytest
from hapi_models import plugins, registry

from hapi_contract import ModelRef
from hapi_core.admission import admit_model
from hapi_core.errors import InvalidRequestError

WEIGHTS = {"container": "models", "object": "x.safetensors", "sha256": "0" * 64}


@pytest.fixture(autouse=True)
def broken_plugins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two broken plugins discovered into a copy of the registry."""
    hapi_models.list_models()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_BROKEN", dict(registry._BROKEN))
    (tmp_path / "hapi_plugin_needs_cuda.py").write_text(
        "raise OSError('libcudart.so.12: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = types.ModuleType("hapi_plugin_returns_a_dict")
    module.build = lambda num_classes: {"num_classes": num_classes}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    points = metadata.EntryPoints(
        [
            metadata.EntryPoint("cudanet", "hapi_plugin_needs_cuda:build", plugins.GROUP),
            metadata.EntryPoint("dictnet", "hapi_plugin_returns_a_dict:build", plugins.GROUP),
        ]
    )
    monkeypatch.setattr(metadata, "entry_points", lambda **_: points)
    plugins.register_plugins()


@pytest.mark.parametrize(
    ("arch", "cause"),
    [
        ("cudanet", "raises on import: OSError: libcudart.so.12"),
        ("dictnet", "its builder returned a dict, not an nn.Module"),
    ],
)
def test_a_broken_plugin_is_a_422_naming_it(arch: str, cause: str) -> None:
    ref = ModelRef.model_validate({"arch": arch, "num_classes": 3, "weights": WEIGHTS})
    with pytest.raises(InvalidRequestError, match=cause) as info:
        admit_model(ref, split=1)
    assert info.value.status == 422
    assert f"plugin {arch!r}" in info.value.detail


@pytest.mark.parametrize("arch", ["resnet18", "tinycnn", "mobilenet_v3_small"])
def test_the_others_are_still_admitted(arch: str) -> None:
    ref = ModelRef.model_validate({"arch": arch, "num_classes": 3, "weights": WEIGHTS})
    spec = admit_model(ref, split=2)
    assert spec.name == arch
