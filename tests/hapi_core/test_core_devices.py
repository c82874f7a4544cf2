"""GPUs are matched to NVML by UUID, so CUDA_VISIBLE_DEVICES cannot make the server read another
GPU's memory (unit tests: a fake NVML and a fake torch.cuda of three GPUs)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from hapi_core import devices as devices_module
from hapi_core.devices import discover_devices, external_used_bytes
from hapi_server import ServerSettings

GiB = 2**30


@dataclass
class FakeGpu:
    uuid: str  # as torch reports it, without NVML's "GPU-" prefix
    total: int
    used: int


# The machine: three GPUs of different sizes, NVML numbers them 0, 1, 2.
MACHINE = [
    FakeGpu("00000000-0000-0000-0000-00000000000a", 16 * GiB, 1 * GiB),
    FakeGpu("00000000-0000-0000-0000-00000000000b", 24 * GiB, 2 * GiB),
    FakeGpu("00000000-0000-0000-0000-00000000000c", 80 * GiB, 5 * GiB),
]


class NVMLError(Exception):
    pass


def fake_pynvml() -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    handles = {f"GPU-{gpu.uuid}": gpu for gpu in MACHINE}
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(MACHINE)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: MACHINE[i]  # type: ignore[attr-defined]
    # bytes, as older pynvml releases answer
    nvml.nvmlDeviceGetUUID = lambda gpu: f"GPU-{gpu.uuid}".encode()  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: handles[uuid]  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda gpu: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=gpu.total, used=gpu.used
    )
    return nvml


@pytest.fixture
def visible(monkeypatch: pytest.MonkeyPatch) -> list[FakeGpu]:
    """torch sees the machine as CUDA_VISIBLE_DEVICES=2,0 shows it: cuda:0 is NVML's GPU 2."""
    seen = [MACHINE[2], MACHINE[0]]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    cuda = devices_module.torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: len(seen))
    monkeypatch.setattr(
        cuda,
        "get_device_properties",
        lambda i: types.SimpleNamespace(uuid=seen[i].uuid, total_memory=seen[i].total - 1),
    )
    monkeypatch.setattr(cuda, "memory_reserved", lambda device: 512 * 2**20)
    return seen


def test_each_torch_gpu_gets_its_own_nvml_memory(visible: list[FakeGpu]) -> None:
    found = discover_devices(ServerSettings(devices="cuda:0,cuda:1"))
    assert [(d.name, d.total_bytes) for d in found] == [("cuda:0", 80 * GiB), ("cuda:1", 16 * GiB)]
    assert [d.nvml_uuid for d in found] == [f"GPU-{g.uuid}" for g in visible]


def test_other_processes_memory_is_read_from_the_same_gpu(visible: list[FakeGpu]) -> None:
    cuda0, cuda1 = discover_devices(ServerSettings(devices="cuda:0,cuda:1"))
    # NVML's used bytes of that GPU, minus what this process's torch holds there (512 MiB).
    assert external_used_bytes(cuda0) == 5 * GiB - 512 * 2**20
    assert external_used_bytes(cuda1) == 1 * GiB - 512 * 2**20


def test_a_gpu_nvml_does_not_list_falls_back_to_torch(
    visible: list[FakeGpu], monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = sys.modules["pynvml"]
    monkeypatch.setattr(nvml, "nvmlDeviceGetCount", lambda: 1)  # NVML sees GPU 0 only
    cuda0, cuda1 = discover_devices(ServerSettings(devices="cuda:0,cuda:1"))
    assert (cuda0.total_bytes, cuda0.nvml_uuid) == (80 * GiB - 1, None)  # torch's own figure
    assert external_used_bytes(cuda0) == 0
    assert cuda1.nvml_uuid == f"GPU-{MACHINE[0].uuid}"
