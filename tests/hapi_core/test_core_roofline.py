"""The roofline: one definition for the benchmark and /metrics, and each running job's ratio
exported while it runs and replaced by the last one's when it stops."""

from __future__ import annotations

import math
import threading

import hapi_models
import pytest
import torch

from hapi_contract import Compression, OutputDtype
from hapi_contract.frames import FrameEncoder
from hapi_core.decode_pool import DecodePool
from hapi_core.devices import Device
from hapi_core.engine import ExtractionJob, JobCancelled, run_extraction
from hapi_core.metrics import Metrics
from hapi_core.roofline import RooflineMeter, roofline_images_per_s
from tests.hapi_core.images import random_jpeg

SMALL = hapi_models.InputTransform(resize=32, crop=32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def test_on_a_cpu_decode_and_head_share_the_cores() -> None:
    # 2 cores, 5 ms of decode and 15 ms of head per image: 20 ms of CPU, 100 images/s.
    assert roofline_images_per_s(2, 0.005, 0.015) == pytest.approx(100.0)
    assert roofline_images_per_s(2, 0.005, 0.015, read_images_per_s=40.0) == 40.0


def test_a_read_on_the_same_cores_adds_its_seconds() -> None:
    # 10 ms per image of compute on the cores, then 2.5 ms of Swift's read on them: 80 images/s.
    ceiling = roofline_images_per_s(2, 0.005, 0.015, read_images_per_s=400.0, read_on_cores=True)
    assert ceiling == pytest.approx(80.0)


def test_with_the_head_on_a_gpu_the_slower_stage_bounds() -> None:
    assert roofline_images_per_s(4, 0.004, 0.002, head_on_cores=False) == pytest.approx(500.0)
    assert roofline_images_per_s(4, 0.001, 0.002, head_on_cores=False) == pytest.approx(500.0)
    assert math.isinf(roofline_images_per_s(4, 0.0, 0.0, head_on_cores=False))


def _job(meter: RooflineMeter, pool: DecodePool, n: int = 6) -> ExtractionJob:
    model = hapi_models.get_spec("alexnet").builder(3, False)
    head = torch.nn.Conv2d(3, 4, 3)
    model.head = lambda split: head  # type: ignore[method-assign]
    return ExtractionJob(
        model=model,
        split=1,
        images=[random_jpeg(i) for i in range(n)],
        labels=[0] * n,
        transform=SMALL,
        batch_size=2,
        device=Device("cpu", 2**30),
        max_pixels=10**6,
        encoder=FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE),
        decode_pool=pool,
        request_id="req-1",
        roofline=meter,
    )


def _running(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "hapi_roofline_ratio", {"device": "cpu", "request": "req-1"}
    )


def _last(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("hapi_roofline_ratio_last", {"device": "cpu"})


@pytest.mark.parametrize("threads", [0, 2])
def test_a_running_job_exports_its_ratio_and_the_last_one_stays(threads: int) -> None:
    metrics = Metrics()
    pool = DecodePool(threads)
    seen: list[float | None] = []
    try:
        stats = run_extraction(
            _job(RooflineMeter(metrics, 2), pool),
            lambda f: seen.append(_running(metrics)),
            threading.Event(),
        )
    finally:
        pool.close()
    assert len(seen) == 3 and all(r is not None and 0 < r < math.inf for r in seen)
    assert stats.decode_cpu_s > 0
    assert _running(metrics) is None  # a finished request is no running one
    last = _last(metrics)
    assert last is not None and 0 < last < math.inf


def test_a_cancelled_job_leaves_no_running_series() -> None:
    metrics = Metrics()
    cancelled = threading.Event()
    with pytest.raises(JobCancelled):
        run_extraction(
            _job(RooflineMeter(metrics, 2), DecodePool(0)), lambda f: cancelled.set(), cancelled
        )
    assert _running(metrics) is None
    assert _last(metrics) is not None
