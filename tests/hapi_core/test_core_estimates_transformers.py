"""The memory estimate of a transformer's head against the peak the engine measures on a CPU,
as tests/hapi_core/test_core_estimates.py does for ResNet18: timm's ViT-Ti/16 cut after its
fifth encoder block (issue 20: measured, not assumed)."""

from __future__ import annotations

import threading

import hapi_models
import pytest

from hapi_contract import DEFAULT_COMPRESSION, DEFAULT_OUTPUT_DTYPE
from hapi_contract.frames import FrameEncoder
from hapi_core.devices import Device
from hapi_core.engine import ExtractionJob, run_extraction
from hapi_core.estimates import MemoryEstimator
from hapi_core.host_memory import HostMemoryProbe
from tests.hapi_server.conftest import make_images

ARCH, SPLIT = "timm/vit_tiny_patch16_224", 19  # blocks.4.add_1: five attention+MLP blocks
SHAPE = (3, 224, 224)


@pytest.fixture(scope="module")
def measured() -> float:
    """Per-sample peak of the head over a lone request's first batch (the engine's probe)."""
    probe = HostMemoryProbe()
    if probe.heap_in_use is None:
        pytest.skip("no glibc mallinfo2 here")
    spec = hapi_models.get_spec(ARCH)
    images, labels = make_images(64, seed=3, side=224)
    job = ExtractionJob(
        model=spec.builder(10, False),
        split=SPLIT,
        images=images,
        labels=labels,
        transform=spec.transform,
        batch_size=32,  # 32 x 588 KiB of input: over the probe's 16 MiB
        device=Device("cpu", 8 * 2**30),
        max_pixels=10**8,
        encoder=FrameEncoder(dtype=DEFAULT_OUTPUT_DTYPE, compression=DEFAULT_COMPRESSION),
        host_memory=probe,
    )
    probe.admitted()  # this job is the one admitted request its probe knows of
    stats = run_extraction(job, lambda frame: None, threading.Event())
    assert stats.cos_batch_sizes == [32, 32] and stats.vmhwm_resets == 1
    assert stats.peak_bytes_per_sample is not None
    return stats.peak_bytes_per_sample


def test_a_transformer_heads_peak_is_measured_and_the_estimate_follows_it(
    measured: float,
) -> None:
    est = MemoryEstimator()
    prof = est.profile(ARCH, 10, SHAPE)
    # The input batch and the split's output certainly coexist at the end of the forward pass.
    assert measured >= prof.input_bytes_per_sample + prof.output_bytes(SPLIT)
    base = est.estimate(ARCH, 10, SHAPE, SPLIT, "cpu").bytes_per_sample
    est.observe(ARCH, 10, SHAPE, SPLIT, "cpu", measured)
    # One reading above the profile raises the estimate at once: the next batch is planned on it.
    after = est.estimate(ARCH, 10, SHAPE, SPLIT, "cpu").bytes_per_sample
    assert after >= measured
    assert after == pytest.approx(max(base, 1.05 * measured), rel=1e-6)


@pytest.mark.xfail(
    strict=False,  # a process whose heap already grew reads less (seen 1.0x after other heads)
    reason="not the activations: the profile counts every tensor alive during each layer and "
    "matches the head's steady peak measured per layer on the CPU (batch 32, tensors mmapped) "
    "within 0.5 %; the probe's reading adds the process's one-time first-batch allocations (a "
    "cold request read 1.5x-1.6x the estimate) and malloc's overhead (a second request 1.085x)",
)
def test_the_profile_alone_covers_a_transformer_heads_peak(measured: float) -> None:
    base = MemoryEstimator().estimate(ARCH, 10, SHAPE, SPLIT, "cpu").bytes_per_sample
    assert base >= measured, f"estimate {base} B/sample, measured {measured:.0f}"
