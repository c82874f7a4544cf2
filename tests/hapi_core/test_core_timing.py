"""A timing request's head (``hapi_core.timing.time_head``): measured until its timings settle,
then answered from them without running the model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import hapi_models
import torch
from torch import nn

from hapi_contract import Compression, ModelRef, OutputDtype, TimingsRequest, TransformSpec
from hapi_contract.frames import FrameEncoder
from hapi_core.timing import measure_head, time_head
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


class _Turns:
    """A turn factory that counts the turns taken and checks none is taken inside another."""

    def __init__(self) -> None:
        self.taken = 0
        self.held = False

    @contextmanager
    def turn(self) -> Iterator[None]:
        assert not self.held
        self.held, self.taken = True, self.taken + 1
        try:
            yield
        finally:
            self.held = False


def test_the_head_is_timed_as_the_extraction_runs_it_folded_in_both_layouts_in_turns() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
    norm = nn.BatchNorm2d(8)
    norm.running_mean.uniform_(-1, 1)
    norm.running_var.uniform_(0.5, 2)
    layers = [conv, norm, nn.ReLU(), nn.Conv2d(8, 4, 3)]
    for layer in layers:
        layer.eval()
    model = cast(hapi_models.SplittableModel, type("Model", (), {"layers": layers})())
    folder = hapi_models.BatchNormFolder(True)
    turns = _Turns()
    images = [random_jpeg(i) for i in range(4)]
    got = measure_head(
        model,
        4,
        images,
        TRANSFORM,
        torch.device("cpu"),
        FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE),
        1 << 24,
        warm_up=True,
        folder=folder,
        layouts=True,
        turn=turns.turn,
    )
    # The norm is folded into the convolution before it: its time is the pair's, given to the
    # convolution layer; its features are the pair's output, the same bytes as the conv's.
    assert len(got.layer_s_per_sample) == len(got.wire_bytes_per_sample) == 4
    assert got.layer_s_per_sample[0] > 0 and got.layer_s_per_sample[1] == 0.0
    assert got.wire_bytes_per_sample[0] == got.wire_bytes_per_sample[1]
    # The folds are the ones an extraction of these layers then runs: made once, kept.
    x = TRANSFORM.decode_batch(images[:1])
    runs = folder.runs(layers, x)
    assert [count for count, _ in runs] == [2, 1, 1]
    assert runs[0][1] is folder.runs(layers, x)[0][1]
    assert not any(isinstance(m, nn.BatchNorm2d) for m in runs[0][1].modules())  # folded
    # The warm-up and each run's timing (both layouts) held a turn at the cores.
    assert turns.taken == 1 + len(runs)
