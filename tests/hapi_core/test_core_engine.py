"""run_batch: an image that does not decode is named by the job's names (both executions); a job
that runs out of host memory says so by type (507), wherever the allocation failed."""

from __future__ import annotations

import io

import hapi_models
import numpy as np
import pytest
import torch
from PIL import Image

from hapi_contract import Compression, OutputDtype
from hapi_contract.frames import FrameEncoder
from hapi_core.devices import Device
from hapi_core.engine import BatchExecutionError, ExtractionJob, JobStats, iter_frames, run_batch

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


def test_a_failed_allocation_of_the_decode_buffer_is_a_batch_execution_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With glibc's mmap threshold fixed (hapi_core.host_allocator), the next batch's uint8
    # buffer is a fresh mapping, and under a memory limit it can be the allocation that fails.
    empty = torch.empty

    def refuse_uint8(*args: object, **kwargs: object) -> torch.Tensor:
        if kwargs.get("dtype") is torch.uint8:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return empty(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(torch, "empty", refuse_uint8)
    job = ExtractionJob(
        model=hapi_models.get_spec("alexnet").builder(3, False),
        split=1,
        images=[_jpeg(0), _jpeg(1)],
        labels=[0, 0],
        transform=SMALL,
        batch_size=2,
        device=Device("cpu", 2**30),
        max_pixels=10_000,
        encoder=FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE),
    )
    with pytest.raises(BatchExecutionError, match="can't allocate memory"):
        list(iter_frames(job, JobStats()))
