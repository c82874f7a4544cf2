"""The engine's pipeline: the next COS batch decodes in the host's pool while the head runs,
requests share the pool in submission order, and a cancelled job leaves no task behind."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import hapi_models
import pytest
import torch

from hapi_contract import Compression, OutputDtype
from hapi_contract.frames import FrameEncoder
from hapi_core.decode_pool import DecodePool, split_threads
from hapi_core.devices import Device
from hapi_core.engine import ExtractionJob, JobCancelled, JobStats, iter_frames, run_extraction
from tests.hapi_core.images import random_jpeg

WAIT_S = 30.0  # a bound on every wait below; reached only when the code under test is wrong


@dataclass(frozen=True)
class _Gated(hapi_models.InputTransform):
    """Decodes image ``gated_from`` on only once ``gate`` is set, saying when it started."""

    gate: threading.Event = threading.Event()
    started: threading.Event = threading.Event()
    gated_from: int = 0

    def decode_uint8(self, data: bytes, *, max_pixels: int | None = None) -> torch.Tensor:
        if data[-3] >= self.gated_from:  # the image's index, appended below
            self.started.set()
            assert self.gate.wait(WAIT_S), "the gate was never opened"
        return super().decode_uint8(data[:-3] + data[-2:], max_pixels=max_pixels)


def _images(n: int) -> list[bytes]:
    # The index rides in the byte before the JPEG's end marker, where the gate reads it;
    # decode_uint8 takes it out again before decoding.
    return [(j := random_jpeg(i))[:-2] + bytes([i]) + j[-2:] for i in range(n)]


def _job(
    transform: hapi_models.InputTransform, pool: DecodePool, n: int, head: torch.nn.Module
) -> ExtractionJob:
    model = hapi_models.get_spec("alexnet").builder(3, False)
    model.head = lambda split: head  # type: ignore[method-assign]
    return ExtractionJob(
        model=model,
        split=1,
        images=_images(n),
        labels=[0] * n,
        transform=transform,
        batch_size=2,
        device=Device("cpu", 2**30),
        max_pixels=10**6,
        encoder=FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE),
        decode_pool=pool,
    )


class _WaitsForDecode(torch.nn.Module):
    """The first batch's head runs only once the next batch's decode has started."""

    def __init__(self, transform: _Gated) -> None:
        super().__init__()
        self.transform = transform
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            assert self.transform.started.wait(WAIT_S), "the next batch did not decode meanwhile"
            self.transform.gate.set()
        return x.mean(dim=(2, 3))


def test_the_next_batch_decodes_while_the_head_runs() -> None:
    transform = _Gated(
        resize=32, crop=32, gate=threading.Event(), started=threading.Event(), gated_from=2
    )
    pool = DecodePool(1)
    head = _WaitsForDecode(transform)
    frames = list(iter_frames(_job(transform, pool, 4, head), JobStats()))
    assert len(frames) == 2 and head.calls == 2


def test_a_cancelled_job_leaves_no_decode_task_in_the_pool() -> None:
    transform = _Gated(
        resize=32, crop=32, gate=threading.Event(), started=threading.Event(), gated_from=2
    )
    pool = DecodePool(1)
    job = _job(transform, pool, 12, torch.nn.Identity())
    cancelled = threading.Event()
    seen: list[tuple[int, int]] = []

    def emit(frame: bytes) -> None:
        # Batch 0 is out; batch 1's first image is running (held at the gate), its second queued.
        assert transform.started.wait(WAIT_S)
        seen.append(pool.pending(job.token))
        cancelled.set()
        transform.gate.set()

    with pytest.raises(JobCancelled):
        run_extraction(job, emit, cancelled)
    assert seen == [(1, 1)]
    assert pool.pending(job.token) == (0, 0)


def test_the_pool_runs_tasks_in_submission_order_across_jobs() -> None:
    pool = DecodePool(1)
    gate, order = threading.Event(), []
    first = pool.submit("gate", lambda: gate.wait(WAIT_S))
    tasks = [pool.submit(job, lambda n=n: order.append(n)) for n, job in enumerate("abab")]
    assert pool.pending("a") == (2, 0)  # behind the gate, whichever thread holds it
    gate.set()
    assert first.result(WAIT_S) is True
    for task in tasks:
        task.result(WAIT_S)
    assert order == [0, 1, 2, 3]
    assert pool.pending("a") == pool.pending("b") == (0, 0)


def test_a_decode_error_reaches_the_job_named() -> None:
    cut = random_jpeg(9)
    # Mid-batch: the batch's later images are still in the pool when the job hears of it.
    images = [
        random_jpeg(0),
        random_jpeg(1),
        cut[: len(cut) // 2],
        *[random_jpeg(i) for i in range(3, 12)],
    ]
    job = _job(
        hapi_models.InputTransform(resize=32, crop=32), DecodePool(1), 12, torch.nn.Identity()
    )
    job.images = images
    job.batch_size = 12
    job.names = [f"c/{i}.jpg" for i in range(12)]
    with pytest.raises(hapi_models.ImageDecodeError, match=r"^c/2\.jpg: cannot decode image"):
        run_extraction(job, lambda frame: None, threading.Event())
    assert job.decode_pool is not None and job.decode_pool.pending(job.token) == (0, 0)


def test_pipelined_frames_equal_the_inline_ones() -> None:
    transform = hapi_models.InputTransform(resize=32, crop=32)
    head = torch.nn.Conv2d(3, 4, 3)
    inline = list(iter_frames(_job(transform, DecodePool(0), 5, head), JobStats()))
    pooled = list(iter_frames(_job(transform, DecodePool(2), 5, head), JobStats()))
    assert inline == pooled and len(inline) == 3


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("cores", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("decode", [None, 0, 1, 4, 100])
@pytest.mark.parametrize("torch_n", [None, 1, 4, 100])
def test_decode_and_torch_threads_never_exceed_the_cores(
    cores: int, decode: int | None, torch_n: int | None, gpu: bool
) -> None:
    d, t = split_threads(cores, decode, torch_n, gpu=gpu)
    assert d >= 0 and t >= 1
    assert d + t <= cores


def test_a_gpu_host_gives_decode_the_cores_and_a_cpu_host_gives_torch() -> None:
    assert split_threads(16, None, None, gpu=True) == (15, 1)
    assert split_threads(16, None, None) == (2, 14)
    assert split_threads(2, None, None) == (0, 2)


def test_the_runtime_shares_its_cores_between_decode_and_torch() -> None:
    from hapi_core.runtime import CoreRuntime
    from hapi_core.settings import CoreSettings

    before = torch.get_num_threads()
    try:
        settings = CoreSettings(cores=16, channels_last=False, decode_path="pil", devices="cpu")
        rt = CoreRuntime.create(settings)
        assert rt.decode_pool.threads == 2 and torch.get_num_threads() == 14
        assert rt.layouts.enabled is False
        options = rt.engine_options()
        assert options["decode_pool"] is rt.decode_pool and options["decode_path"] == "pil"
        rt.decode_pool.close()
    finally:
        torch.set_num_threads(before)
