"""The extraction core's typed choices (unit tests): the status of an error frame follows the
failure's type, never its message, and the engine types torch's failures on a batch."""

from __future__ import annotations

import io

import hapi_models
import pytest
import torch
from PIL import Image

from hapi_contract import Compression, ModelRef, OutputDtype, TransformSpec
from hapi_contract.frames import FrameEncoder
from hapi_core.admission import admit_model, input_transform
from hapi_core.answers import stream_error
from hapi_core.engine import BatchExecutionError, JobStats, run_batch
from hapi_core.errors import InvalidRequestError, QueueFullError


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (torch.OutOfMemoryError("CUDA out of memory"), 507),
        (MemoryError(), 507),
        (BatchExecutionError("DefaultCPUAllocator: can't allocate memory"), 507),
        # The same words in an untyped error choose nothing: a plain RuntimeError is a 500.
        (RuntimeError("out of memory; can't allocate memory"), 500),
        (ValueError("boom"), 500),
        (hapi_models.ImageDecodeError("truncated"), 422),
        (QueueFullError("full"), 503),
    ],
)
def test_the_error_frame_status_follows_the_type(exc: BaseException, status: int) -> None:
    got, detail = stream_error(exc)
    assert got == status
    assert detail


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


class _Failing(torch.nn.Module):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise self.exc


def _run(head: torch.nn.Module) -> bytes:
    transform = hapi_models.InputTransform(resize=8, crop=8)
    encoder = FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE)
    return run_batch(
        head, transform, [_png()], [0], 0, 1, torch.device("cpu"), encoder, 10_000, JobStats()
    )


def test_a_runtime_error_on_a_checked_batch_is_typed_by_the_engine() -> None:
    # What torch 2.14's CPU allocator raises: a bare RuntimeError, no subclass.
    with pytest.raises(BatchExecutionError) as info:
        _run(_Failing(RuntimeError("DefaultCPUAllocator: can't allocate memory")))
    assert stream_error(info.value)[0] == 507
    with pytest.raises(NotImplementedError):  # an operator the device lacks is not memory
        _run(_Failing(NotImplementedError("no kernel")))
    assert _run(torch.nn.Identity()).startswith(b"HAPI")


def test_admission_and_transform_come_from_the_request() -> None:
    with pytest.raises(InvalidRequestError, match="weights is required"):
        admit_model(ModelRef(arch="alexnet", num_classes=3), 2)
    with pytest.raises(InvalidRequestError, match="out of range"):
        admit_model(ModelRef(arch="alexnet", num_classes=3), 999)
    spec = TransformSpec(resize=72, crop=64, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    transform = input_transform(spec)
    assert (transform.resize, transform.crop, transform.mean) == (72, 64, (0.5, 0.5, 0.5))
    assert TransformSpec.model_validate(transform) == spec  # and back, by attribute
