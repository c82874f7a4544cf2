"""``hapi models``: the listing and each architecture's split points, as text and as JSON.

The expected rows come from :func:`hapi_models.split_points` and the registry, which the command
must print faithfully. The whole listing traces every network the cache does not hold yet (about
a minute on a 2-core CPU), so its test lists two of them.
"""

from __future__ import annotations

import json

import hapi_models
import pytest

from hapi_cli.main import main
from hapi_cli.models_cmd import DEFAULT_JPEG_KB


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["models", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _row(out: str, index: int) -> list[str]:
    """The cells of split point ``index``'s row in a detail table."""
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0] == str(index):
            return cells
    raise AssertionError(f"no row {index} in:\n{out}")


@pytest.mark.parametrize("arch", ["alexnet", "vit_b_16"])
def test_detail_prints_every_split_point_and_marks_the_default_freeze(
    capsys: pytest.CaptureFixture[str], arch: str
) -> None:
    code, out, _ = _run(capsys, arch)
    assert code == 0
    spec = hapi_models.get_spec(arch)
    points = hapi_models.split_points(arch)
    assert out.startswith(
        f"{arch} ({spec.family}): {len(points)} split points, input 3x224x224, default freeze "
        f"index {spec.default_freeze_index}"
    )
    for p in points:
        cells = _row(out, p.index)
        assert cells[1:5] == [
            p.name,
            "x".join(map(str, p.sample_shape)),
            f"{p.bytes_per_sample(4) / 1e3:.1f}",
            f"{p.bytes_per_sample(2) / 1e3:.1f}",
        ]
        assert ("default freeze" in " ".join(cells)) == (p.index == spec.default_freeze_index)


def test_thesis_and_torchvision_families(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "alexnet", "vit_b_16")
    assert "alexnet (thesis)" in out and "vit_b_16 (torchvision)" in out
    # A ViT's frozen backbone ships its class token: 768 values, far below the stored image.
    freeze = hapi_models.get_spec("vit_b_16").default_freeze_index
    assert _row(out.split("vit_b_16 (")[1], freeze)[2] == "768"


def test_json_holds_each_split_point(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "resnet18", "timm/convnext_atto", "--json")
    assert code == 0
    models = json.loads(out)["models"]
    assert [m["name"] for m in models] == ["resnet18", "timm/convnext_atto"]
    assert models[1]["family"] == "timm"
    for model in models:
        points = hapi_models.split_points(model["name"])
        freeze = hapi_models.get_spec(model["name"]).default_freeze_index
        assert model["default_freeze_index"] == freeze
        assert model["split_points"] == [
            {
                "index": p.index,
                "layer": p.name,
                "shape": list(p.sample_shape),
                "bytes_float32": p.bytes_per_sample(4),
                "bytes_bfloat16": p.bytes_per_sample(2),
                "default_freeze": p.index == freeze,
            }
            for p in points
        ]


def test_listing_one_line_per_architecture(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hapi_models, "list_models", lambda: ["alexnet", "mobilenet_v3_small"])
    code, out, _ = _run(capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "name",
        "family",
        "splits",
        "freeze",
        "input",
        "f32",
        "KB",
        "bf16",
        "KB",
        "JPEG/bf16",
    ]
    for name, line in zip(["alexnet", "mobilenet_v3_small"], lines[2:4], strict=True):
        spec = hapi_models.get_spec(name)
        points = hapi_models.split_points(name)
        freeze = points[spec.default_freeze_index]
        bf16 = freeze.bytes_per_sample(2)
        assert line.split() == [
            name,
            spec.family,
            str(len(points)),
            str(freeze.index),
            f"({freeze.name})",
            "3x224x224",
            f"{freeze.bytes_per_sample(4) / 1e3:.1f}",
            f"{bf16 / 1e3:.1f}",
            f"{DEFAULT_JPEG_KB * 1e3 / bf16:.1f}x",
        ]

    code, out, _ = _run(capsys, "--json", "--jpeg-kb", "50")
    listing = json.loads(out)
    assert listing["jpeg_bytes"] == 50_000
    assert [m["name"] for m in listing["models"]] == ["alexnet", "mobilenet_v3_small"]
    alexnet = listing["models"][0]
    assert alexnet["jpeg_over_bfloat16"] == round(50_000 / alexnet["freeze_bytes_bfloat16"], 2)


@pytest.mark.parametrize("argv", [["nosuchnet"], ["alexnet", "resnet5"], ["timm/nosuchnet"]])
def test_unknown_name_exits_2_with_the_registrys_error(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert out == ""  # nothing printed for the names before the unknown one
    unknown = argv[-1]
    with pytest.raises(hapi_models.UnknownModelError) as raised:
        hapi_models.get_spec(unknown)
    assert err.strip() == f"hapi: error: {raised.value}"


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_jpeg_size_must_be_positive(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, _, err = _run(capsys, "--jpeg-kb", value)
    assert code == 2 and "--jpeg-kb" in err


def test_listing_goes_on_past_a_network_that_cannot_be_traced(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = hapi_models.describe_model

    def describe_model(arch: str) -> hapi_models.ModelListing:
        if arch == "alexnet":
            raise hapi_models.UntraceableModelError("alexnet: a data-dependent branch")
        return real(arch)

    monkeypatch.setattr(hapi_models, "list_models", lambda: ["alexnet", "mobilenet_v3_small"])
    monkeypatch.setattr(hapi_models, "describe_model", describe_model)
    code, out, err = _run(capsys, "--json")
    assert code == 1
    listing = json.loads(out)
    assert [m["name"] for m in listing["models"]] == ["mobilenet_v3_small"]
    assert listing["failed"] == {"alexnet": "alexnet: a data-dependent branch"}
    assert err.strip() == "hapi: error: alexnet: alexnet: a data-dependent branch"


def test_listing_names_a_plugin_that_failed_to_load(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cause = "plugin 'cudanet' (broken_hapi_cuda:build, from broken) raises on import: OSError"
    monkeypatch.setattr(hapi_models, "list_models", lambda: ["alexnet"])
    monkeypatch.setattr(hapi_models, "broken_plugins", lambda: {"cudanet": cause})
    code, out, err = _run(capsys)
    assert code == 1
    assert "alexnet" in out and "cudanet" not in out
    assert err.strip() == f"hapi: error: cudanet: {cause}"
