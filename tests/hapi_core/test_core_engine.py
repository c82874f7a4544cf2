"""run_batch: an image that does not decode is named by the job's names (both executions)."""

from __future__ import annotations

import io

import hapi_models
import numpy as np
import pytest
import torch
from PIL import Image

from hapi_contract import Compression, OutputDtype
from hapi_contract.frames import FrameEncoder
from hapi_core.engine import JobStats, run_batch

SMALL = hapi_models.InputTransform(resize=32, crop=32)


def _jpeg(seed: int) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def test_a_truncated_image_in_a_later_batch_is_named_by_its_own_entry() -> None:
    cut = _jpeg(3)
    images = [_jpeg(0), _jpeg(1), _jpeg(2), cut[: len(cut) // 2]]
    names = [f"data/img/{i:04d}.jpg" for i in range(len(images))]
    stats = JobStats()

    def batch(start: int) -> bytes:
        return run_batch(
            torch.nn.Identity(),
            SMALL,
            images,
            [0] * len(images),
            start,
            2,
            torch.device("cpu"),
            FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE),
            10_000,
            stats,
            names,
        )

    assert batch(0)
    with pytest.raises(hapi_models.ImageDecodeError, match=r"^data/img/0003\.jpg: cannot decode"):
        batch(2)
