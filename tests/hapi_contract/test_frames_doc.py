"""``docs/frames.md`` is the format: its worked example decodes, with the codec and without it.

The second reader below uses only what the page says (struct, json, zlib), as a client in
another language would, so a page that drifts from the codec fails here.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from hapi_contract import RemoteStreamError
from hapi_contract.frames import BatchFrame, FrameDecoder

DOC = Path(__file__).resolve().parents[2] / "docs" / "frames.md"


def _example(name: str) -> bytes:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"<!-- frames-example: {name} -->\n```text\n(.*?)```", text, re.S)
    assert match, f"docs/frames.md has no example {name!r}"
    data = bytearray()
    for line in match.group(1).splitlines():
        offset, _, hexes = line.partition("  ")
        assert int(offset, 16) == len(data), f"offset column {offset} out of step"
        data += bytes.fromhex(hexes)
    return bytes(data)


def _read_by_the_doc(body: bytes) -> list[dict[str, Any]]:
    """A reader written from the page: prefix, big-endian length, JSON header, payload."""
    frames, pos = [], 0
    while pos < len(body):
        magic, version, length = struct.unpack_from(">4sBI", body, pos)
        assert (magic, version) == (b"HAPI", 1)
        header = json.loads(body[pos + 9 : pos + 9 + length].decode("utf-8"))
        pos += 9 + length
        if header["kind"] == "batch":
            feats, labs = header["features"], header["labels"]
            wire = body[pos : pos + feats["wire_nbytes"]]
            label_bytes = body[
                pos + feats["wire_nbytes"] : pos + feats["wire_nbytes"] + labs["nbytes"]
            ]
            assert zlib.crc32(wire) == feats["crc32"] and zlib.crc32(label_bytes) == labs["crc32"]
            assert feats["dtype"] == "float16" and feats["codec"] == "none"
            count = len(wire) // 2
            header["values"] = list(struct.unpack(f"<{count}e", wire))
            header["label_values"] = list(struct.unpack(f"<{labs['shape'][0]}q", label_bytes))
            pos += feats["wire_nbytes"] + labs["nbytes"]
        frames.append(header)
    return frames


def test_the_worked_example_decodes_with_the_codec() -> None:
    decoder = FrameDecoder()
    body = _example("stream")
    # One byte at a time: chunk boundaries mean nothing.
    frames = [f for i in range(len(body)) for f in decoder.feed(body[i : i + 1])]
    end = decoder.close()
    batch = frames[0]
    assert isinstance(batch, BatchFrame)
    assert (batch.offset, batch.count, batch.features.dtype) == (0, 2, torch.float16)
    expected = torch.tensor([[1.0, -2.0, 0.5], [0.25, 0.0, 3.0]], dtype=torch.float16)
    assert torch.equal(batch.features, expected)
    assert batch.labels.tolist() == [3, 7]
    assert (end.samples, end.frames, end.payload_bytes) == (2, 1, 28)
    assert len(body) == 348


def test_the_worked_example_decodes_from_the_page_alone() -> None:
    batch, end = _read_by_the_doc(_example("stream"))
    assert batch["values"] == [1.0, -2.0, 0.5, 0.25, 0.0, 3.0]
    assert batch["label_values"] == [3, 7]
    assert end == {
        "kind": "end",
        "totals": {"samples": 2, "frames": 1, "payload_bytes": 28},
        "meta": {},
    }


def test_the_error_example_is_an_error_frame() -> None:
    (header,) = _read_by_the_doc(_example("error"))
    assert header == {"kind": "error", "status": 500, "detail": "CUDA out of memory"}
    with pytest.raises(RemoteStreamError) as info:
        FrameDecoder().feed(_example("error"))
    assert (info.value.status, info.value.detail) == (500, "CUDA out of memory")


def test_contract_top_level_imports_without_torch() -> None:
    code = (
        "import sys, hapi_contract; "
        "from hapi_contract import ExtractRequest, CONTENT_TYPE_FRAMES, FinetuneMetrics; "
        "print(sorted(m for m in ('torch', 'numpy', 'zstandard') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
