"""BASELINE's own decode names an image that does not decode (issue 28, case 6).

The client reads a folder part's images, or a WebDataset tar, with the contract's reader and
decodes them itself; a body cut past its header is found only by that decode, which must say
which object (or which shard and key) to fix. A fake Swift stands in for the reads: the same
paths run against the real one in ``test_in_place_modes.py``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import hapi_models
import numpy as np
import pytest
from PIL import Image

from hapi_client.shard_loaders import raw_loader
from hapi_contract import DatasetLayout, DatasetManifest, ShardInfo, md5_hex
from tests.in_place_data import put_folder_dataset, webdataset_tar

SMALL = hapi_models.InputTransform(resize=32, crop=32)


class FakeSwift:
    """Objects in memory, answered as :class:`hapi_client.SwiftSession` answers a GET."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}

    def put_container(self, container: str) -> None:
        pass

    def put_object(self, container: str, name: str, data: bytes) -> None:
        self.objects[(container, name)] = data

    def get(
        self, container: str, name: str, *, observe: Callable[..., Any] | bool | None = None
    ) -> tuple[bytes, str]:
        data = self.objects[(container, name)]
        return data, md5_hex(data)


def _images(n: int) -> list[bytes]:
    out = []
    for seed in range(n):
        arr = np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=85)
        out.append(buf.getvalue())
    out[-1] = out[-1][: len(out[-1]) // 2]  # its header opens; its body does not decode
    return out


def test_a_truncated_folder_image_is_named_by_its_object() -> None:
    swift = FakeSwift()
    folder = put_folder_dataset(swift, "index", "photos", _images(3), [0, 1, 2], part_size=3)  # type: ignore[arg-type]
    load = raw_loader(swift, folder.manifest, "index", SMALL)  # type: ignore[arg-type]
    with pytest.raises(hapi_models.ImageDecodeError) as info:
        load(0)
    assert str(info.value).startswith(f"photos/{folder.names[2]}: cannot decode image")


def test_a_truncated_webdataset_image_is_named_by_shard_and_key() -> None:
    swift = FakeSwift()
    tar = webdataset_tar(_images(2), [0, 1], label_field="y")
    swift.put_object("wds", "train-0000.tar", tar)
    info = ShardInfo(
        name="train-0000.tar",
        samples=2,
        bytes=len(tar),
        etag=md5_hex(tar),
        first_index=0,
        image_bytes=len(tar),
    )
    manifest = DatasetManifest.build(
        name="wds",
        classes=("a", "b"),
        shards=[info],
        shard_size=2,
        layout=DatasetLayout.WEBDATASET,
        label_field="y",
    )
    load = raw_loader(swift, manifest, "wds", SMALL)  # type: ignore[arg-type]
    with pytest.raises(
        hapi_models.ImageDecodeError,
        match=r"^shard wds/train-0000\.tar: sample train/sample_00001: cannot decode image",
    ):
        load(0)
