"""A safetensors blob in memory as tensors that are views of it: nothing copied.

The safetensors library has no zero-copy load from memory: ``safetensors.torch.load`` takes
``bytes`` (a ``bytearray`` must first be copied into one) and copies every tensor out of them
into its own storage, and ``safe_open`` needs a file. Loading a model's weights through it held
the blob, a second copy in the state dict and the parameters at once, where the server plans the
blob and the parameters only (issue 27: a 1.2 GB ViT-L/16 blob peaked at over 3.6 GB). This
module reads the layout itself and validates it as safetensors does: an 8-byte little-endian
header length ``N``, a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}``, then the data, every tensor's bytes following the previous one's
without a hole or an overlap.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import warnings
from typing import Any

import torch

from .errors import WeightsError

#: The largest header accepted, as safetensors (its ``MAX_HEADER_SIZE``): a length field of
#: garbage must not make the parse read or allocate gigabytes.
MAX_HEADER_BYTES = 100_000_000

_METADATA = "__metadata__"

#: safetensors' names of the dtypes its torch mapping supports, those torch has here.
_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    **{
        name: dtype
        for name, attr in (
            ("F8_E4M3", "float8_e4m3fn"),
            ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
            ("F8_E5M2", "float8_e5m2"),
            ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
        )
        if (dtype := getattr(torch, attr, None)) is not None
    },
}


def tensor_views(blob: bytes | bytearray | memoryview) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors ``blob``, each a read-only view of its bytes.

    The views keep ``blob`` alive and must only be read (``load_state_dict`` copies them into
    the parameters); a ``bytearray`` cannot be resized while they exist.

    Raises:
        WeightsError: a malformed blob (the message names what is wrong), or a big-endian host.
    """
    if sys.byteorder != "little":
        # safetensors stores little-endian; a view on this host would misread every value.
        raise WeightsError(
            "safetensors weights are little-endian and are read in place: not on this "
            f"{sys.byteorder}-endian host"
        )
    data = _bytes_view(blob)
    header, start = _header(data)
    layout = _layout(header, len(data) - start)
    state: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        # torch warns that a read-only buffer (``bytes``) would be written through a view;
        # these views are only read, by load_state_dict's copy into the parameters.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        for name, dtype, shape, begin, end in layout:
            if begin == end:  # frombuffer refuses an empty count; nothing to share
                state[name] = torch.empty(shape, dtype=dtype)
                continue
            count = (end - begin) // dtype.itemsize
            flat = torch.frombuffer(data, dtype=dtype, count=count, offset=start + begin)
            state[name] = flat.view(shape)
    return state


def _bytes_view(blob: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(blob)
    if not view.c_contiguous:
        raise WeightsError("not a safetensors blob: the buffer is not contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _header(data: memoryview) -> tuple[dict[str, Any], int]:
    """The parsed JSON header and where the data begins."""
    if len(data) < 8:
        raise WeightsError(
            f"not a safetensors blob: {len(data)} bytes, fewer than the 8 of the header length"
        )
    (size,) = struct.unpack("<Q", data[:8])
    if size > MAX_HEADER_BYTES:
        raise WeightsError(
            f"not a safetensors blob: a header of {size} bytes, over the limit of "
            f"{MAX_HEADER_BYTES}"
        )
    if 8 + size > len(data):
        raise WeightsError(
            f"not a safetensors blob: a header of {size} bytes in a blob of {len(data)}"
        )
    try:
        header = json.loads(
            bytes(data[8 : 8 + size]).decode("utf-8"), object_pairs_hook=_refuse_duplicates
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"not a safetensors blob: the header is not UTF-8 JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise WeightsError(
            f"not a safetensors blob: the header is a JSON {type(header).__name__}, not an object"
        )
    return header, 8 + size


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise WeightsError(f"not a safetensors blob: the header names {key!r} twice")
        out[key] = value
    return out


_Entry = tuple[str, torch.dtype, list[int], int, int]


def _layout(header: dict[str, Any], data_bytes: int) -> list[_Entry]:
    """Each tensor's name, dtype, shape and byte range in the data, sorted by where it begins;
    refused unless the ranges tile the data exactly, as safetensors requires."""
    metadata = header.get(_METADATA)
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(v, str) for v in metadata.values())  # keys: JSON's are strings
    ):
        raise WeightsError(
            "not a safetensors blob: __metadata__ is not a mapping of strings to strings"
        )
    entries = [_entry(name, info, data_bytes) for name, info in header.items() if name != _METADATA]
    entries.sort(key=lambda entry: (entry[3], entry[4]))
    at = 0
    for name, _, _, begin, end in entries:
        if begin != at:
            problem = "overlaps the previous tensor" if begin < at else "leaves a hole before it"
            raise WeightsError(
                f"not a safetensors blob: tensor {name!r} begins at byte {begin} of the data "
                f"where the previous one ends at {at}: it {problem}"
            )
        at = end
    if at != data_bytes:
        raise WeightsError(
            f"not a safetensors blob: the tensors end at byte {at} of the data, which holds "
            f"{data_bytes}"
        )
    return entries


def _entry(name: str, info: Any, data_bytes: int) -> _Entry:
    def bad(what: str) -> WeightsError:
        return WeightsError(f"not a safetensors blob: tensor {name!r}: {what}")

    if not isinstance(info, dict):
        raise bad(f"its entry is a JSON {type(info).__name__}, not an object")
    dtype_name = info.get("dtype")
    if dtype_name not in _DTYPES:
        raise bad(f"unknown dtype {dtype_name!r} (known: {', '.join(_DTYPES)})")
    dtype = _DTYPES[dtype_name]
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise bad(f"shape {shape!r} is not a list of non-negative integers")
    offsets = info.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(n) for n in offsets)
        or offsets[0] > offsets[1]
    ):
        raise bad(f"data_offsets {offsets!r} are not [begin, end] with 0 <= begin <= end")
    begin, end = offsets
    if end > data_bytes:
        raise bad(f"data_offsets {offsets!r} run past the data's {data_bytes} bytes")
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise bad(
            f"{end - begin} bytes, where shape {shape} of {dtype_name} takes {expected} bytes"
        )
    return name, dtype, shape, begin, end


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
