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


@pytest.mark.parametrize(
    ("name", "num_classes"), [("resnet18", 3), ("squeezenet1_1", 1000)], ids=["resnet18", "sq11"]
)
@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "path"])
def test_round_trip_from_every_source_gives_equal_parameters(
    name: str, num_classes: int, kind: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    saved = hm.get_model(name, num_classes=num_classes)
    blob = hm.weights_to_bytes(saved)
    path = tmp_path / "w.safetensors"
    path.write_bytes(blob)
    sources: dict[str, bytes | bytearray | memoryview | Path] = {
        "bytes": blob,
        "bytearray": bytearray(blob),
        "memoryview": memoryview(bytearray(blob)),
        "path": path,
    }
    loaded = hm.get_model(name, num_classes=num_classes, weights=sources[kind])
    want, got = saved.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


class _NoBytes(bytearray):
    """A blob that refuses to be copied into ``bytes``."""

    def __bytes__(self) -> bytes:
        raise AssertionError("the blob was copied into bytes")


def test_a_bytearray_blob_is_read_in_place_and_only_the_parameters_copy_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27: the plan counts the blob and the parameters. The state dict handed to the
    strict load is views of the blob (no copy of it as bytes, none per tensor); the parameters
    are copies (the blob changed afterwards leaves the model as it was)."""
    torch.manual_seed(0)
    saved = hm.get_model("resnet18", num_classes=3)
    blob = _NoBytes(hm.weights_to_bytes(saved))
    base = torch.frombuffer(blob, dtype=torch.uint8).data_ptr()
    handed: list[dict[str, torch.Tensor]] = []
    original = torch.nn.Module.load_state_dict

    def spy(
        self: torch.nn.Module, state: dict[str, torch.Tensor], *a: object, **k: object
    ) -> object:
        handed.append(state)
        return original(self, state, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", spy)
    model = hm.get_model("resnet18", num_classes=3, weights=blob)
    monkeypatch.undo()
    (state,) = handed
    for key, tensor in state.items():
        if tensor.numel():
            assert base <= tensor.data_ptr() < base + len(blob), f"{key} is a copy of the blob"
    del state
    handed.clear()
    blob[:] = bytes(len(blob))  # possible again once the views are gone
    for key, value in saved.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
