"""safetensors weights with sha256; nothing unpickled."""

from __future__ import annotations

from pathlib import Path

import hapi_models as hm
import pytest
import torch


def test_round_trip_preserves_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    a = hm.get_model("resnet18", num_classes=4)
    path = tmp_path / "w.safetensors"
    digest = hm.save_weights(a, path)
    assert digest == hm.sha256_hex(path.read_bytes())
    torch.manual_seed(1)
    b = hm.get_model("resnet18", num_classes=4, weights=path, sha256=digest)
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)


def test_a_model_built_to_load_weights_draws_no_random_init() -> None:
    """The strict load sets every parameter: the constructor's random draws are skipped (the
    generator does not move) and the model computes what the saved one did."""
    torch.manual_seed(0)
    saved = hm.get_model("efficientnet_lite0", num_classes=5)
    blob = hm.weights_to_bytes(saved)
    before = torch.get_rng_state()
    loaded = hm.get_model("efficientnet_lite0", num_classes=5, weights=blob)
    assert torch.equal(torch.get_rng_state(), before)
    # A model built without weights still draws its init.
    hm.get_model("efficientnet_lite0", num_classes=5)
    assert not torch.equal(torch.get_rng_state(), before)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        torch.testing.assert_close(saved(x), loaded(x), rtol=0, atol=0)


def test_sha256_mismatch_is_refused_before_parsing() -> None:
    blob = hm.weights_to_bytes(hm.get_model("alexnet", num_classes=2))
    with pytest.raises(hm.ChecksumMismatchError, match="mismatch"):
        hm.get_model("alexnet", num_classes=2, weights=blob, sha256="0" * 64)


def test_pickle_formats_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.pth"
    path.write_bytes(b"not even read")
    with pytest.raises(hm.WeightsError, match="safetensors"):
        hm.get_model("alexnet", num_classes=2, weights=path)


def test_garbage_and_wrong_architecture_are_clear_errors() -> None:
    with pytest.raises(hm.WeightsError, match="safetensors"):
        hm.get_model("alexnet", num_classes=2, weights=b"\x00" * 64)
    blob = hm.weights_to_bytes(hm.get_model("alexnet", num_classes=3))
    with pytest.raises(hm.WeightsError, match="do not fit"):
        hm.get_model("alexnet", num_classes=2, weights=blob)


def test_bad_digest_string() -> None:
    blob = hm.weights_to_bytes(hm.get_model("alexnet", num_classes=2))
    with pytest.raises(hm.WeightsError, match="sha256"):
        hm.get_model("alexnet", num_classes=2, weights=blob, sha256="xyz")
