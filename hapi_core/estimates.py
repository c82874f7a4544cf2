"""Per-sample memory estimates of running a head, from the server's own profile.

The client sends its profile with each request, but memory planning never trusts a figure the
client reports: the server profiles the registered architecture itself (a meta-device pass, a few
milliseconds, cached), and corrects the estimate from measured peaks: CUDA's allocator
statistics on a GPU, the process's resident high-water mark over a lone batch on a CPU
(:class:`hapi_core.host_memory.HostMemoryProbe`).
"""

from __future__ import annotations

import functools
import logging
import math
from collections import deque
from dataclasses import dataclass

import hapi_models
import torch

from .errors import InvalidRequestError
from .locks import os_lock

log = logging.getLogger(__name__)

ProfileKey = tuple[str, int, tuple[int, int, int]]

#: A request's frames alive on the host beside the batch being computed, each at most the
#: batch's float32 output: the last one sent, which the response still holds while the next is
#: computed (``eventlet.wsgi`` and the proxy's middlewares keep their loop's last chunk;
#: uvicorn its last body), and one queued for it (the HAPI server's frame queue holds one).
#: Unplanned, they were about 4 MiB per sample at ResNet18's early splits at 576 px (issue 27).
FRAMES_IN_FLIGHT = 2


@dataclass(frozen=True)
class HeadEstimate:
    bytes_per_sample: int
    head_weight_bytes: int
    output_bytes_per_sample: int


@dataclass(frozen=True)
class ModelFootprint:
    """What a model of one architecture and class count weighs, known before it is built."""

    resident_bytes: int
    """Parameters and buffers once loaded (what the weights cache counts, with
    :attr:`folded_bytes` on a host that folds)."""
    state_bytes: int
    """The tensors of its state dict, as ``hapi_models.weights_to_bytes`` writes them."""
    state_key_bytes: int
    """The UTF-8 length of every state-dict key together (they fill a safetensors header)."""
    num_tensors: int
    folded_bytes: int = 0
    """The folded copies of its convolutions that a batch norm follows, which a host folding
    its heads (``fold_batch_norms``) holds beside the model once every split has run."""


@functools.lru_cache(maxsize=256)
def model_footprint(arch: str, num_classes: int) -> ModelFootprint:
    """The footprint of ``arch`` with ``num_classes`` outputs, from a meta-device skeleton.

    Nothing is allocated, so a 100000-class VGG19 costs a few milliseconds here, where building
    it costs seconds and gigabytes: the planner and the size checks run on this figure first.
    A RegNet cannot be built on the meta device (see ``hapi_models.zoo.graph_families``) and
    costs its CPU build once per class count.
    """
    spec = hapi_models.get_spec(arch)
    with torch.device("meta"):
        skeleton = spec.builder(num_classes, False)
    resident = sum(p.numel() * p.element_size() for p in skeleton.parameters()) + sum(
        b.numel() * b.element_size() for b in skeleton.buffers()
    )
    folded = _folded_bytes(skeleton, spec.transform.input_shape)
    state = skeleton.state_dict()
    return ModelFootprint(
        resident_bytes=resident,
        folded_bytes=folded,
        state_bytes=sum(t.numel() * t.element_size() for t in state.values()),
        state_key_bytes=sum(len(k.encode()) for k in state),
        num_tensors=len(state),
    )


def _folded_bytes(skeleton: hapi_models.SplittableModel, input_shape: tuple[int, ...]) -> int:
    """The bytes of every layer's folded convolutions, from a pass of the skeleton's device
    (meta: nothing computed); a network that cannot run there counts all its convolutions."""
    skeleton.eval()
    x = torch.empty((1, *input_shape), device=next(skeleton.parameters()).device)
    try:
        return hapi_models.folded_parameter_bytes(list(skeleton.layers), x)
    except Exception as exc:  # noqa: BLE001 - any failure to run it: the upper bound instead
        log.debug("folded bytes of %s from its convolutions: %s", skeleton.arch, exc)
        convs = [m for m in skeleton.modules() if isinstance(m, torch.nn.Conv2d)]
        return sum((m.weight.numel() + m.out_channels) * m.weight.element_size() for m in convs)


class MemoryEstimator:
    """Per-sample memory of a head: the profile's figure, corrected from measured peaks.

    The profile counts the input batch, the largest layer's input and output (and a leaf's
    input a second time) and the output copy, and on a CPU the frames in flight
    (:data:`FRAMES_IN_FLIGHT`), so on a CPU it is above the real use (measured before the
    frames were counted: 0.73x for AlexNet up to its freeze index, 0.64x for ResNet18 at split
    4, linear in the batch size, within 0.1 % from batch to batch; a head's first batch reads
    about 6 % more, for one-time allocations that stay in the process afterwards). The correction per head and device
    type is the largest of the last ``window`` measurements times ``1 + margin`` (the CPU probe
    takes four readings per head, so the default window of three leaves the first one out):

    * a measurement above the estimate raises it at once, whatever the device;
    * it goes below the profile only on device types whose measurements are clean (taken while
      nothing else ran: the CPU probe reports no other), after ``min_samples`` of them, and
      never below ``floor`` x the profile. CUDA's peaks are device-wide and may include other
      requests' frees, so a GPU estimate is only ever raised, as before.

    The margin covers the batch-to-batch spread and memory another request freed meanwhile (a
    finished request's shard, at most one object); the floor bounds any reading the probe
    missed: the real peak holds at least the input batch and one layer's input and output,
    about half the profile's figure, which counts that input twice.
    """

    def __init__(
        self,
        *,
        margin: float = 0.05,
        window: int = 3,
        min_samples: int = 3,
        floor: float = 0.5,
        lowering_devices: frozenset[str] = frozenset({"cpu"}),
    ) -> None:
        self._profiles: dict[ProfileKey, hapi_models.ModelProfile] = {}
        self._measured: dict[tuple[ProfileKey, int, str], deque[float]] = {}
        self._correction: dict[tuple[ProfileKey, int, str], float] = {}
        self._margin = margin
        self._window = window
        self._min_samples = min_samples
        self._floor = floor
        self._lowering = lowering_devices
        self._lock = os_lock()

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
        except hapi_models.InputSizeError as exc:  # the rule the client checks before sending
            raise InvalidRequestError(str(exc)) from exc
        with self._lock:
            self._profiles[key] = prof
        return prof

    def _base(self, prof: hapi_models.ModelProfile, split: int, device_type: str) -> int:
        # Input batch, the peak of the head's layers, and the output copy that gets encoded;
        # on the host, the earlier batches' frames still alive too.
        frames = FRAMES_IN_FLIGHT * prof.output_bytes(split) if device_type == "cpu" else 0
        return (
            prof.input_bytes_per_sample
            + prof.head_activation_bytes_per_sample(split)
            + prof.output_bytes(split)
            + frames
        )

    def estimate(
        self, arch: str, num_classes: int, shape: tuple[int, int, int], split: int, device_type: str
    ) -> HeadEstimate:
        prof = self.profile(arch, num_classes, shape)
        with self._lock:
            factor = self._correction.get(((arch, num_classes, shape), split, device_type), 1.0)
        return HeadEstimate(
            bytes_per_sample=math.ceil(self._base(prof, split, device_type) * factor),
            head_weight_bytes=prof.head_weight_bytes(split),
            output_bytes_per_sample=prof.output_bytes(split),
        )

    def correction(
        self, arch: str, num_classes: int, shape: tuple[int, int, int], split: int, device_type: str
    ) -> float:
        """The factor the profile's figure is multiplied by (1.0 before any measurement)."""
        with self._lock:
            return self._correction.get(((arch, num_classes, shape), split, device_type), 1.0)

    def observe(
        self,
        arch: str,
        num_classes: int,
        shape: tuple[int, int, int],
        split: int,
        device_type: str,
        measured_bytes_per_sample: float,
    ) -> None:
        """Fold one request's measured peak per sample into the head's correction factor."""
        if not math.isfinite(measured_bytes_per_sample) or measured_bytes_per_sample <= 0:
            return  # a reading of nothing says nothing
        base = max(1, self._base(self.profile(arch, num_classes, shape), split, device_type))
        key = ((arch, num_classes, shape), split, device_type)
        with self._lock:
            recent = self._measured.setdefault(key, deque(maxlen=self._window))
            recent.append(measured_bytes_per_sample)
            factor = max(recent) * (1 + self._margin) / base
            if device_type in self._lowering and len(recent) >= self._min_samples:
                factor = max(self._floor, factor)
            else:
                factor = max(1.0, factor)
            old = self._correction.get(key, 1.0)
            self._correction[key] = factor
        if abs(factor - old) > 0.01:
            log.info(
                "%s split %d on %s: memory per sample %.0f -> %.0f bytes (measured %.0f)",
                arch,
                split,
                device_type,
                base * old,
                base * factor,
                measured_bytes_per_sample,
            )
