"""Compute devices and their memory: NVML and torch on a GPU, a configured budget on a CPU.

torch numbers the GPUs it sees (``CUDA_VISIBLE_DEVICES`` filters and reorders them) and NVML
numbers every GPU of the machine, so the two indices name the same GPU only by chance. A torch
device is matched to its NVML device by UUID, which both report. The host's memory (what a CPU
device's batches measure) is :mod:`hapi_core.host_memory`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .settings import CoreSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Device:
    name: str
    """torch device string: ``cpu`` or ``cuda:N``."""
    total_bytes: int
    nvml_uuid: str | None = None
    """NVML's UUID of this GPU (``GPU-...``), when NVML knows it."""

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.name)

    @property
    def is_cuda(self) -> bool:
        return self.name.startswith("cuda")


def _nvml_totals() -> dict[str, int]:
    """NVML UUID -> total memory in bytes, of every GPU of the machine; empty when NVML is
    missing (CPU mode, said once)."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no NVML (%s): CPU mode", exc)
        return {}
    totals = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        totals[_text(pynvml.nvmlDeviceGetUUID(handle))] = int(
            pynvml.nvmlDeviceGetMemoryInfo(handle).total
        )
    return totals


def _text(value: str | bytes) -> str:
    # pynvml answers bytes in older releases and str in newer ones.
    return value.decode() if isinstance(value, bytes) else value


def torch_uuid(index: int) -> str:
    """The NVML-style UUID (``GPU-xxxxxxxx-...``) of torch's GPU ``index``."""
    return f"GPU-{torch.cuda.get_device_properties(index).uuid}"


def discover_devices(settings: CoreSettings) -> list[Device]:
    names = [n.strip() for n in settings.devices.split(",")] if settings.devices else []
    nvml = _nvml_totals()
    if not names:
        names = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]
    devices = []
    for name in names:
        if name == "cpu":
            devices.append(Device("cpu", settings.cpu_memory_budget_bytes))
            continue
        index = torch.device(name).index or 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name} is not available (torch sees {torch.cuda.device_count()} GPUs)"
            )
        uuid = torch_uuid(index)
        total = nvml.get(uuid) or torch.cuda.get_device_properties(index).total_memory
        if settings.gpu_memory_limit_bytes is not None:
            total = min(total, settings.gpu_memory_limit_bytes)
        devices.append(Device(name, int(total), uuid if uuid in nvml else None))
    return devices


def external_used_bytes(device: Device) -> int:
    """GPU memory used by other processes (NVML used minus what this process's torch reserved)."""
    if not device.is_cuda or device.nvml_uuid is None:
        return 0
    import pynvml

    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(device.nvml_uuid)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError:
        return 0
    own = torch.cuda.memory_reserved(device.torch_device)
    return max(0, int(info.used) - int(own))
