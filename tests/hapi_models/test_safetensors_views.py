"""A safetensors blob read in place: the tensors are views of it, a malformed one is refused."""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

import hapi_models as hm
import pytest
import safetensors.torch
import torch
from hapi_models.safetensors_views import MAX_HEADER_BYTES, tensor_views


def _blob(header: Any, data: bytes = b"", *, raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _f32(name: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {name: {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)  # exact, NaNs and float8 included


def test_a_blob_saved_by_safetensors_reads_back_in_every_dtype() -> None:
    torch.manual_seed(0)
    state = {
        "f16": torch.randn(3, 5).half(),
        "bf16": torch.randn(7).bfloat16(),
        "f64": torch.randn(2, 2, dtype=torch.float64),
        "i64": torch.arange(-4, 8, dtype=torch.int64).view(3, 4),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([[True, False], [False, True]]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    if hasattr(torch, "float8_e4m3fn"):
        state["f8"] = torch.randn(4).to(torch.float8_e4m3fn)
    blob = safetensors.torch.save(state, metadata={"format": "pt"})
    for source in (blob, bytearray(blob), memoryview(blob)):
        got = tensor_views(source)
        assert got.keys() == state.keys()
        for key, value in state.items():
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert torch.equal(_bits(got[key]), _bits(value)), key


_W = struct.pack("<4f", 1, 2, 3, 4)

_MALFORMED: dict[str, tuple[bytes, str]] = {
    "shorter than the length": (b"\x01\x00", "fewer than the 8"),
    "header past the blob": (struct.pack("<Q", 64) + b"{}", "header of 64 bytes in a blob of 10"),
    "header over the limit": (struct.pack("<Q", MAX_HEADER_BYTES + 1), "over the limit"),
    "header not JSON": (_blob(None, raw=b"{not json"), "not UTF-8 JSON"),
    "header not UTF-8": (_blob(None, raw=b'{"\xff": 1}'), "not UTF-8 JSON"),
    "header a list": (_blob([1, 2]), "JSON list, not an object"),
    "duplicate name": (_blob(None, _W, raw=b'{"w": 1, "w": 2}'), "names 'w' twice"),
    "entry not an object": (_blob({"w": [1]}), "entry is a JSON list"),
    "unknown dtype": (
        _blob({"w": {"dtype": "F12", "shape": [4], "data_offsets": [0, 16]}}, _W),
        "unknown dtype 'F12'",
    ),
    "negative dim": (_blob(_f32("w", [-4], 0, 16), _W), "not a list of non-negative"),
    "bool dim": (_blob(_f32("w", [True], 0, 4), _W[:4]), "not a list of non-negative"),
    "shape not a list": (_blob(_f32("w", 4, 0, 16), _W), "not a list of non-negative"),  # type: ignore[arg-type]
    "offsets reversed": (_blob(_f32("w", [0], 16, 0), _W), "0 <= begin <= end"),
    "offsets not a pair": (
        _blob({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0]}}, _W),
        "0 <= begin <= end",
    ),
    "offsets past the data": (_blob(_f32("w", [8], 0, 32), _W), "run past the data's 16"),
    "length not numel x size": (_blob(_f32("w", [3], 0, 16), _W), "16 bytes, where shape [3]"),
    "overlap": (
        _blob({**_f32("a", [3], 0, 12), **_f32("b", [3], 4, 16)}, _W),
        "overlaps the previous",
    ),
    "hole": (_blob({**_f32("a", [1], 0, 4), **_f32("b", [2], 8, 16)}, _W), "leaves a hole"),
    "short of the data's end": (_blob(_f32("w", [3], 0, 12), _W), "end at byte 12 of the data"),
    "metadata not a dict": (_blob({"__metadata__": ["x"]}), "__metadata__"),
    "metadata value not str": (_blob({"__metadata__": {"format": 1}}), "__metadata__"),
}


@pytest.mark.parametrize(("blob", "message"), _MALFORMED.values(), ids=list(_MALFORMED))
def test_a_malformed_blob_is_refused_with_what_is_wrong(blob: bytes, message: str) -> None:
    with pytest.raises(hm.WeightsError, match="not a safetensors blob") as caught:
        tensor_views(blob)
    assert message in str(caught.value)


def test_a_malformed_blob_is_refused_by_load_weights() -> None:
    model = torch.nn.Linear(2, 2)
    blob, message = _MALFORMED["overlap"]
    with pytest.raises(hm.WeightsError, match="overlaps"):
        hm.load_weights(model, bytearray(blob))


def test_a_well_formed_hand_made_blob_with_metadata_reads() -> None:
    blob = _blob({"__metadata__": {"format": "pt"}, **_f32("w", [2, 2], 0, 16)}, _W)
    (value,) = tensor_views(blob).values()
    assert torch.equal(value, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))


def test_a_big_endian_host_is_refused_rather_than_misread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "byteorder", "big")
    with pytest.raises(hm.WeightsError, match="little-endian"):
        tensor_views(safetensors.torch.save({"w": torch.ones(2)}))
