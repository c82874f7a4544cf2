"""Per-sample memory estimates of running a head, from the server's own profile.

The client sends its profile with each request, but memory planning never trusts a figure the
client reports: the server profiles the registered architecture itself (a meta-device pass, a few
milliseconds, cached), and corrects the estimate from measured peaks where the device reports
them (CUDA's allocator statistics; a CPU has no per-request allocator statistics, so its
estimate stays the profile's).
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass

import hapi_models
import torch

from .errors import InvalidRequestError

log = logging.getLogger(__name__)

ProfileKey = tuple[str, int, tuple[int, int, int]]


@dataclass(frozen=True)
class HeadEstimate:
    bytes_per_sample: int
    head_weight_bytes: int
    output_bytes_per_sample: int


@dataclass(frozen=True)
class ModelFootprint:
    """What a model of one architecture and class count weighs, known before it is built."""

    resident_bytes: int
    """Parameters and buffers once loaded (what the weights cache counts)."""
    state_bytes: int
    """The tensors of its state dict, as ``hapi_models.weights_to_bytes`` writes them."""
    state_key_bytes: int
    """The UTF-8 length of every state-dict key together (they fill a safetensors header)."""
    num_tensors: int


@functools.lru_cache(maxsize=256)
def model_footprint(arch: str, num_classes: int) -> ModelFootprint:
    """The footprint of ``arch`` with ``num_classes`` outputs, from a meta-device skeleton.

    Nothing is allocated, so a 100000-class VGG19 costs a few milliseconds here, where building
    it costs seconds and gigabytes: the planner and the size checks run on this figure first.
    """
    with torch.device("meta"):
        skeleton = hapi_models.get_spec(arch).builder(num_classes, False)
    resident = sum(p.numel() * p.element_size() for p in skeleton.parameters()) + sum(
        b.numel() * b.element_size() for b in skeleton.buffers()
    )
    state = skeleton.state_dict()
    return ModelFootprint(
        resident_bytes=resident,
        state_bytes=sum(t.numel() * t.element_size() for t in state.values()),
        state_key_bytes=sum(len(k.encode()) for k in state),
        num_tensors=len(state),
    )


class MemoryEstimator:
    def __init__(self, smoothing: float = 0.5) -> None:
        self._profiles: dict[ProfileKey, hapi_models.ModelProfile] = {}
        self._correction: dict[tuple[ProfileKey, int, str], float] = {}
        self._smoothing = smoothing
        self._lock = threading.Lock()

    def profile(
        self, arch: str, num_classes: int, shape: tuple[int, int, int]
    ) -> hapi_models.ModelProfile:
        key = (arch, num_classes, shape)
        with self._lock:
            cached = self._profiles.get(key)
        if cached is not None:
            return cached
        with torch.device("meta"):
            skeleton = hapi_models.get_spec(arch).builder(num_classes, False)
        try:
            prof = hapi_models.profile(skeleton, shape)
        except RuntimeError as exc:  # e.g. a crop too small for the network's pooling
            raise InvalidRequestError(
                f"{arch} cannot run on {shape[1]}x{shape[2]} inputs: {str(exc).splitlines()[0]}"
            ) from exc
        with self._lock:
            self._profiles[key] = prof
        return prof

    def estimate(
        self, arch: str, num_classes: int, shape: tuple[int, int, int], split: int, device_type: str
    ) -> HeadEstimate:
        prof = self.profile(arch, num_classes, shape)
        # Input batch, the peak of the head's layers, and the output copy that gets encoded.
        base = (
            prof.input_bytes_per_sample
            + prof.head_activation_bytes_per_sample(split)
            + prof.output_bytes(split)
        )
        factor = self._correction.get(((arch, num_classes, shape), split, device_type), 1.0)
        return HeadEstimate(
            bytes_per_sample=int(base * factor),
            head_weight_bytes=prof.head_weight_bytes(split),
            output_bytes_per_sample=prof.output_bytes(split),
        )

    def observe(
        self,
        arch: str,
        num_classes: int,
        shape: tuple[int, int, int],
        split: int,
        device_type: str,
        measured_bytes_per_sample: float,
    ) -> None:
        """Fold a measured peak per sample into the correction factor (never below 1)."""
        prof = self.profile(arch, num_classes, shape)
        base = (
            prof.input_bytes_per_sample
            + prof.head_activation_bytes_per_sample(split)
            + prof.output_bytes(split)
        )
        ratio = max(1.0, measured_bytes_per_sample / max(1, base))
        key = ((arch, num_classes, shape), split, device_type)
        with self._lock:
            old = self._correction.get(key, ratio)
            self._correction[key] = (1 - self._smoothing) * old + self._smoothing * ratio
