"""A timing request's head (``hapi_core.timing.time_head``): measured until its timings settle,
then answered from them without running the model."""

from __future__ import annotations

from typing import cast

import hapi_models
import torch
from torch import nn

from hapi_contract import Compression, ModelRef, OutputDtype, TimingsRequest, TransformSpec
from hapi_core.timing import time_head
from hapi_core.timing_cache import SETTLE_MEASUREMENTS, LayerTimes
from tests.hapi_core.images import random_jpeg

TRANSFORM = hapi_models.InputTransform(resize=32, crop=32)


class _Counted(nn.Module):
    """A layer that counts the samples it ran over."""

    def __init__(self) -> None:
        super().__init__()
        self.samples = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.samples += len(x)
        return x * 0.5


def _request() -> TimingsRequest:
    return TimingsRequest(
        container="data",
        shard="shards/shard-000000.tar",
        model=ModelRef(arch="alexnet", num_classes=10),
        split_index=2,
        transform=TransformSpec.model_validate(TRANSFORM),
        b_max=4,
        samples=2,
        output_dtype=OutputDtype.FLOAT32,
        compression=Compression.NONE,
    )


def test_the_head_is_measured_until_it_settles_then_answered_without_running_it() -> None:
    layers = [_Counted(), _Counted()]
    model = cast(hapi_models.SplittableModel, type("Model", (), {"layers": layers})())
    cache = LayerTimes.empty()
    images = [random_jpeg(0), random_jpeg(1)]

    def ask() -> tuple[bool, list[float]]:
        got = time_head(
            model, _request(), images, TRANSFORM, torch.device("cpu"), cache, 1 << 24, 0
        )
        return got.cached, got.layer_s_per_sample

    measured = [ask() for _ in range(SETTLE_MEASUREMENTS)]
    assert [cached for cached, _ in measured] == [False] * SETTLE_MEASUREMENTS
    # Each answer is the fastest seen so far, layer by layer.
    for (_, earlier), (_, later) in zip(measured, measured[1:], strict=False):
        assert all(b <= a for a, b in zip(earlier, later, strict=True))
    ran = [layer.samples for layer in layers]
    assert ran[0] > 0
    settled = [ask() for _ in range(2)]
    assert settled == [(True, measured[-1][1])] * 2
    assert [layer.samples for layer in layers] == ran  # the model did not run again
    assert (cache.hits, cache.measured) == (2, SETTLE_MEASUREMENTS)
