"""Everything one extraction host holds: devices, their schedulers, the caches and metrics.

The HAPI server holds one (:class:`hapi_server.state.ServerState` extends it with its Swift
reader and worker threads); so does the Swift filter's in-proxy execution, created on its first
request. Both plan memory, cache verified models and keep layer times in the same objects.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Self

import torch
from hapi_models import BatchNormFolder, LayoutChooser

from .adaptation import DeviceScheduler, Timers
from .decode_pool import DecodePool, available_cores, split_threads
from .devices import Device, discover_devices
from .estimates import MemoryEstimator
from .forward_turns import ForwardTurns
from .host_allocator import bound_host_allocator
from .host_memory import PROCESS_MEMORY, resident_bytes, resident_in_use_bytes
from .locks import os_lock
from .metrics import Metrics
from .roofline import RooflineMeter
from .settings import CoreSettings
from .shared_features import FeatureStore
from .timing_cache import LayerTimes
from .weights_cache import WeightsCache

__all__ = ["CoreRuntime"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CoreRuntime:
    settings: CoreSettings
    devices: list[Device]
    schedulers: dict[str, DeviceScheduler]
    weights: WeightsCache
    estimator: MemoryEstimator
    metrics: Metrics
    layer_times: LayerTimes = field(default_factory=LayerTimes.empty)
    """Per-layer seconds per sample measured by timing requests, per model and device."""
    decode_pool: DecodePool = field(default_factory=lambda: DecodePool(0))
    """The threads that decode every request's next COS batch (none: each job decodes)."""
    layouts: LayoutChooser = field(default_factory=LayoutChooser)
    """Whether each head runs faster on a channels_last input, measured once."""
    folder: BatchNormFolder = field(default_factory=lambda: BatchNormFolder(False))
    """Each head's layers with their batch norms folded into the convolutions, made once."""
    features: FeatureStore = field(default_factory=lambda: FeatureStore(0, None, None))
    """Computed features shared between requests (off unless ``feature_store_bytes``)."""
    roofline: RooflineMeter | None = None
    """Exports each running request's ratio to the host's roofline (None: not exported)."""
    turns: ForwardTurns | None = None
    """The CPU's turns for the heads' forward passes (None: every job runs its own)."""

    @classmethod
    def create(cls, settings: CoreSettings, timers: Timers | None = None, **extra: Any) -> Self:
        """Discover the devices and set torch up as ``settings`` say; ``timers`` start the
        schedulers' planning rounds (default: the running asyncio loop). ``extra``: the fields
        a subclass adds."""
        # Before the pools' threads start: freed request memory must leave the process or be
        # reused, else the resident size outgrows the plan (see host_allocator).
        bound_host_allocator()
        # Decode and torch's intra-op threads share the cores given: oversubscribed, the
        # head's threads and the decode's preempt each other and both slow down.
        cores = settings.cores or available_cores()
        gpu = settings.devices is None and torch.cuda.is_available()
        gpu = gpu or "cuda" in (settings.devices or "")
        decode_threads, torch_threads = split_threads(
            cores, settings.decode_threads, settings.torch_threads, gpu=gpu
        )
        torch.set_num_threads(torch_threads)
        # hapi_models imports torchvision lazily (clients that never build a model skip it); a
        # host builds models and decodes images for every request, so take its ~170 MB and
        # seconds now rather than inside the first request's admitted memory and latency.
        import torchvision.models
        import torchvision.transforms.v2  # noqa: F401

        # cuDNN runs float32 convolutions in TF32 by default: on an H100, features of a float32
        # request then differed from the CPU head by up to 1e-3 relative (5e-2 absolute for
        # EfficientNet-Lite0 at split 10), which breaks "splitting never changes results".
        torch.backends.cudnn.allow_tf32 = settings.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = settings.allow_tf32
        devices = discover_devices(settings)
        metrics = Metrics()
        # Sampled, not VmHWM: the process's peak as /metrics reports it and the batch probe reads.
        PROCESS_MEMORY.start(settings.memory_sample_interval_s)
        metrics.watch_process(resident_bytes, lambda: PROCESS_MEMORY.peak_bytes)
        weights = WeightsCache(settings.weights_cache_bytes)
        schedulers = {}
        for device in devices:
            sched = DeviceScheduler(device, settings, metrics)
            if timers is not None:
                sched.timers = timers
            sched.resident_weights = weights.resident_bytes
            sched.evict_idle = weights.evict_idle
            sched.reclaim = weights.reclaim
            if not device.is_cuda and settings.count_process_memory:
                sched.process_memory = resident_in_use_bytes
            schedulers[device.name] = sched
        turns = ForwardTurns(settings.cpu_forwards_at_once or max(1, cores // torch_threads))
        log.info(
            "HAPI devices: %s; %d core(s): %d decode thread(s), %d torch thread(s), %d forward "
            "pass(es) at once on a CPU; decode %s, channels_last %s, batch norms %s",
            ", ".join(f"{d.name} ({d.total_bytes / 2**30:.1f} GiB)" for d in devices),
            cores,
            decode_threads,
            torch_threads,
            turns.slots,
            settings.decode_path,
            "where faster" if settings.channels_last else "off",
            "folded" if settings.fold_batch_norms else "as built",
        )
        return cls(
            settings=settings,
            devices=devices,
            schedulers=schedulers,
            weights=weights,
            estimator=MemoryEstimator(),
            metrics=metrics,
            features=FeatureStore(
                settings.feature_store_bytes, settings.feature_store_dir, metrics
            ),
            decode_pool=DecodePool(decode_threads),
            layouts=LayoutChooser(settings.channels_last, persist=True),
            folder=BatchNormFolder(settings.fold_batch_norms, lock=os_lock),
            roofline=RooflineMeter(metrics, decode_threads + torch_threads),
            turns=turns,
            **extra,
        )

    def engine_options(self) -> dict[str, Any]:
        """What every :class:`~hapi_core.engine.ExtractionJob` of this host shares."""
        return {
            "decode_pool": self.decode_pool,
            "decode_path": self.settings.decode_path,
            "layouts": self.layouts,
            "folder": self.folder,
            "roofline": self.roofline,
            "turns": self.turns,
        }

    def pick_scheduler(self) -> DeviceScheduler:
        """Spread requests evenly: the device with the fewest waiting + running requests."""
        return min(self.schedulers.values(), key=lambda s: (s.load, -s.free_bytes()))
