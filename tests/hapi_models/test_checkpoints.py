"""Pretrained weights from outside: checkpoints written here, read without unpickling code."""

from __future__ import annotations

import os
import pickle
import urllib.error
from pathlib import Path

import hapi_models as hm
import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from torchvision import models as tvm


def _same_outputs(model: nn.Module, native: nn.Module, size: int = 64) -> None:
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        # The same modules with the same weights and inputs in one process: equal to rounding.
        torch.testing.assert_close(model.eval()(x), native.eval()(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", hm.list_models())
def test_every_tensor_of_every_model_has_its_native_name(arch: str) -> None:
    with torch.device("meta"):
        model = hm.get_model(arch, num_classes=10)
    assert sorted(model.native_keys.values()) == sorted(model.state_dict())


@pytest.mark.parametrize(
    ("arch", "factory"),
    [("alexnet", tvm.alexnet), ("resnet18", tvm.resnet18), ("densenet121", tvm.densenet121)],
)
def test_torchvision_checkpoint_imports_with_its_class_count(
    arch: str, factory: object, tmp_path: Path
) -> None:
    torch.manual_seed(5)
    native = factory(num_classes=7)  # type: ignore[operator]
    path = tmp_path / f"{arch}.pth"
    torch.save(native.state_dict(), path)
    model = hm.import_weights(arch, hm.read_checkpoint(path))
    assert model.num_classes == 7
    _same_outputs(model, native)


def test_timm_keys_and_safetensors_for_efficientnet(tmp_path: Path) -> None:
    native = hm.get_model("efficientnet_lite0", num_classes=5)
    timm_state = {k: native.state_dict()[v] for k, v in native.native_keys.items()}
    assert "conv_stem.weight" in timm_state and "classifier.weight" in timm_state
    save_file(timm_state, str(tmp_path / "lite0.safetensors"))
    model = hm.import_weights(
        "efficientnet_lite0", hm.read_checkpoint(tmp_path / "lite0.safetensors")
    )
    assert model.num_classes == 5
    _same_outputs(model, native)


def test_hapi_layer_keys_nested_and_prefixed_checkpoints(tmp_path: Path) -> None:
    torch.manual_seed(1)
    native = tvm.resnet18(num_classes=4)
    # A Lightning-style file: the weights under "state_dict", every key prefixed "model.",
    # beside non-tensor entries; and a DDP-style one with "module.".
    lightning = {
        "epoch": 3,
        "state_dict": {f"model.{k}": v for k, v in native.state_dict().items()},
    }
    torch.save(lightning, tmp_path / "last.ckpt")
    ddp = {f"module.{k}": v for k, v in native.state_dict().items()}
    torch.save(ddp, tmp_path / "ddp.pt")
    for name in ("last.ckpt", "ddp.pt"):
        _same_outputs(hm.import_weights("resnet18", hm.read_checkpoint(tmp_path / name)), native)
    # HAPI's own layer-list keys (what `hapi upload model` stores) come back unchanged.
    ours = hm.import_weights("resnet18", hm.read_checkpoint(tmp_path / "ddp.pt"))
    hm.save_weights(ours, tmp_path / "ours.safetensors")
    again = hm.import_weights("resnet18", hm.read_checkpoint(tmp_path / "ours.safetensors"))
    _same_outputs(again, native)


def test_a_checkpoint_of_another_architecture_is_refused_with_names(tmp_path: Path) -> None:
    torch.save(tvm.resnet18().state_dict(), tmp_path / "r18.pth")
    with pytest.raises(
        hm.WeightsError, match=r"does not fit resnet50: \d+ missing \(layer1\.0\.conv3"
    ):
        hm.import_weights("resnet50", hm.read_checkpoint(tmp_path / "r18.pth"))
    state = tvm.alexnet(num_classes=3).state_dict()
    state["features.0.weight"] = torch.zeros(8, 3, 11, 11)
    with pytest.raises(hm.WeightsError, match=r"features\.0\.weight: checkpoint \[8, 3, 11, 11\]"):
        hm.import_weights("alexnet", state)
    with pytest.raises(hm.WeightsError, match="3 classes but num_classes=10"):
        hm.import_weights("alexnet", tvm.alexnet(num_classes=3).state_dict(), num_classes=10)


class _Payload:
    """Unpickling this object would create a file: the loader must refuse before that."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_pickled_code_is_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pth"
    torch.save({"fc.weight": torch.zeros(2, 2), "payload": _Payload(marker)}, path)
    with pytest.raises(hm.WeightsError, match="restricted loader"):
        hm.read_checkpoint(path)
    assert not marker.exists()
    # A plain pickle file, not even a torch one.
    path.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(hm.WeightsError):
        hm.read_checkpoint(path)
    assert not marker.exists()
    # A whole module (torch.save(model)) instead of its state dict.
    torch.save(nn.Linear(2, 2), path)
    with pytest.raises(hm.WeightsError, match=r"model\.state_dict\(\)"):
        hm.read_checkpoint(path)


def test_torchvision_weights_from_the_hub_cache_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.manual_seed(2)
    native = tvm.densenet121()
    # torchvision's DenseNet files use the old key names ('norm.1') and predate BatchNorm's
    # batch counter; both must be handled.
    legacy = {
        k.replace("norm1", "norm.1").replace("conv2", "conv.2"): v
        for k, v in native.state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    assert any(".norm.1." in k for k in legacy)
    url = tvm.DenseNet121_Weights.DEFAULT.url
    torch.save(legacy, cache / Path(url).name)
    model = hm.import_weights("densenet121", hm.torchvision_weights("densenet121", progress=False))
    assert model.num_classes == 1000
    _same_outputs(model, native, size=32)


def test_torchvision_weights_offline_error_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))

    def unreachable(*args: object, **kwargs: object) -> None:  # no network in a unit test
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(torch.hub, "download_url_to_file", unreachable)
    expected = tmp_path / "hub" / "checkpoints" / Path(tvm.ResNet18_Weights.DEFAULT.url).name
    with pytest.raises(hm.PretrainedWeightsUnavailableError, match=str(expected)):
        hm.torchvision_weights("resnet18", progress=False)
    with pytest.raises(hm.PretrainedWeightsUnavailableError, match="not a torchvision model"):
        hm.torchvision_weights("efficientnet_lite0")


# Files that are no checkpoint: each a CheckpointError naming the file and what was found, read
# within the weights size limit, never an error of torch's or safetensors' own.


def _refused(path: Path, match: str, **kwargs: int) -> str:
    for read in (hm.read_checkpoint, hm.check_checkpoint):
        with pytest.raises(hm.CheckpointError, match=match) as err:
            read(path, **kwargs)
        assert str(path) in str(err.value)
    return str(err.value)


def test_a_text_file_named_pth_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "notes.pth"
    path.write_text("hello, these are my notes\n")
    message = _refused(path, "not a PyTorch or safetensors checkpoint: found text 'hello, these")
    assert "IndexError" not in message
    (tmp_path / "empty.pt").write_bytes(b"")
    _refused(tmp_path / "empty.pt", "found an empty file")
    (tmp_path / "noise.bin").write_bytes(bytes(range(200, 256)) * 3)
    _refused(tmp_path / "noise.bin", "found binary data starting c8 c9 ca")


def test_a_fake_safetensors_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "fake.safetensors"
    path.write_text("this is not safetensors at all")
    _refused(path, "not a PyTorch or safetensors checkpoint: found text 'this is not")
    # A header whose JSON safetensors refuses.
    path.write_bytes((7).to_bytes(8, "little") + b"{oops!}")
    with pytest.raises(hm.CheckpointError, match="a safetensors header that safetensors refuses"):
        hm.read_checkpoint(path)


def test_a_safetensors_header_declaring_2_gib_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge-header.safetensors"
    path.write_bytes((2 * 2**30).to_bytes(8, "little") + b'{"a": 1}')
    _refused(path, r"a safetensors header declaring 2147483648 bytes of JSON, but only 8 bytes")


def test_a_damaged_torch_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "cut.pth"
    torch.save({"fc.weight": torch.zeros(4, 4)}, path)
    path.write_bytes(path.read_bytes()[:100])  # a zip archive cut short
    with pytest.raises(hm.CheckpointError, match="a torch zip archive that torch cannot read"):
        hm.read_checkpoint(path)
    path.write_bytes(b"\x80\x02" + b"\x00" * 20)  # a pickle stream of garbage
    with pytest.raises(hm.WeightsError, match=str(path)):
        hm.read_checkpoint(path)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_a_fifo_and_a_directory_are_refused_before_reading(tmp_path: Path) -> None:
    _refused(Path("/dev/zero"), "found a character device, not a regular file")
    fifo = tmp_path / "pipe.pth"
    os.mkfifo(fifo)  # no writer: opening it blocking would hang
    _refused(fifo, "found a FIFO, not a regular file")
    _refused(tmp_path, "found a directory, not a regular file")
    _refused(tmp_path / "missing.pth", "cannot read checkpoint .*: No such file")


def test_reads_are_bounded_by_the_weights_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "model.pth"
    torch.save({"fc.weight": torch.zeros(64, 64)}, path)
    size = path.stat().st_size
    assert set(hm.read_checkpoint(path, max_bytes=size)) == {"fc.weight"}
    _refused(path, rf"{size} bytes, over the limit of {size - 1} bytes", max_bytes=size - 1)
    # HAPI's own safetensors loader reads paths through the same bounded reader.
    st = tmp_path / "layer.safetensors"
    hm.save_weights(nn.Linear(2, 2), st)
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(hm.CheckpointError, match="found a FIFO"):
        hm.load_weights(nn.Linear(2, 2), fifo)


def test_the_limit_is_the_servers_default_max_weights_bytes() -> None:
    from hapi_core.settings import CoreSettings

    assert hm.MAX_WEIGHTS_BYTES == CoreSettings().max_weights_bytes
