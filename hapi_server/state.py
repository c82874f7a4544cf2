"""Everything one server instance holds: devices, schedulers, caches, Swift reader, metrics."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .adaptation import DeviceScheduler
from .devices import Device, discover_devices
from .estimates import MemoryEstimator
from .metrics import Metrics
from .settings import ServerSettings
from .swift_io import SwiftReader
from .timing_cache import LayerTimes
from .weights_cache import WeightsCache

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    settings: ServerSettings
    devices: list[Device]
    schedulers: dict[str, DeviceScheduler]
    weights: WeightsCache
    estimator: MemoryEstimator
    swift: SwiftReader
    metrics: Metrics
    executor: ThreadPoolExecutor
    layer_times: LayerTimes = field(default_factory=LayerTimes.empty)
    """Per-layer seconds per sample measured by ``POST /v1/timings``, per model and device."""

    @classmethod
    def create(cls, settings: ServerSettings) -> ServerState:
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        # hapi_models imports torchvision lazily (clients that never build a model skip it); a
        # server builds models and decodes images for every request, so take its ~170 MB and
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
        weights = WeightsCache(settings.weights_cache_bytes)
        schedulers = {}
        for device in devices:
            sched = DeviceScheduler(device, settings, metrics)
            sched.resident_weights = weights.resident_bytes
            sched.evict_idle = weights.evict_idle
            schedulers[device.name] = sched
        workers = settings.max_concurrent_per_device * len(devices)
        log.info(
            "HAPI server devices: %s",
            ", ".join(f"{d.name} ({d.total_bytes / 2**30:.1f} GiB)" for d in devices),
        )
        return cls(
            settings=settings,
            devices=devices,
            schedulers=schedulers,
            weights=weights,
            estimator=MemoryEstimator(),
            swift=SwiftReader(settings.swift_url, settings.swift_timeout_s),
            metrics=metrics,
            executor=ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hapi-compute"),
        )

    def pick_scheduler(self) -> DeviceScheduler:
        """Spread requests evenly: the device with the fewest waiting + running requests."""
        return min(self.schedulers.values(), key=lambda s: (s.load, -s.free_bytes()))

    async def aclose(self) -> None:
        await self.swift.aclose()
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown, True)
