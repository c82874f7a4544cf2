"""What the benchmarks run on: cores per side, pinning, CPU-time readers, machine and versions.

Client and server get disjoint cores (the thesis ran them on two machines): on a 2-core machine
the client gets core 0 and the storage side (Swift and the HAPI server) core 1. Pinning is done
with ``sched_setaffinity`` on every thread of a process, which is what ``taskset -a -p`` does;
children inherit the mask of the thread that spawns them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CoreSplit",
    "cpu_seconds",
    "machine_info",
    "pin_process",
    "process_cpu_seconds",
    "split_cores",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CoreSplit:
    """Which cores the client and the storage side (Swift + HAPI server) run on."""

    client: tuple[int, ...]
    server: tuple[int, ...]

    @property
    def disjoint(self) -> bool:
        return not set(self.client) & set(self.server)

    def describe(self) -> str:
        how = "separate cores" if self.disjoint else "shared cores (only one core available)"
        return (
            f"client on core(s) {','.join(map(str, self.client))}, Swift + HAPI server on "
            f"core(s) {','.join(map(str, self.server))} ({how}, set with sched_setaffinity like taskset)"
        )


def split_cores(available: set[int] | None = None) -> CoreSplit:
    """Half of the usable cores (at least one) for each side; the client gets the lower ones."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    if len(cores) == 1:
        return CoreSplit((cores[0],), (cores[0],))
    half = len(cores) // 2
    return CoreSplit(tuple(cores[:half]), tuple(cores[half:]))


def pin_process(cores: tuple[int, ...], pid: int | None = None) -> None:
    """Pin every thread of ``pid`` (default: this process) to ``cores``."""
    target = os.getpid() if pid is None else pid
    for task in Path(f"/proc/{target}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), set(cores))
        except (ProcessLookupError, FileNotFoundError):
            continue  # the thread ended meanwhile


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads), or None if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14, 15)


def cpu_seconds(pids: list[int]) -> float:
    """Sum of :func:`process_cpu_seconds` over ``pids`` (gone ones count 0)."""
    return sum(process_cpu_seconds(p) or 0.0 for p in pids)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class MachineInfo:
    cpu: str
    cores: int
    memory_gib: float | None
    kernel: str
    python: str
    versions: dict[str, str | None]
    gpu: str | None


def machine_info() -> dict[str, Any]:
    """The hardware and software a result was measured on (goes into every JSON and CSV)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    info = MachineInfo(
        cpu=_cpu_model(),
        cores=os.cpu_count() or 1,  # the machine's, not this (pinned) process's
        memory_gib=_memory_gib(),
        kernel=platform.release(),
        python=platform.python_version(),
        versions={
            name: _version(name)
            for name in ("hapi", "torch", "torchvision", "swift", "fastapi", "uvicorn", "httpx")
        },
        gpu=gpu,
    )
    return asdict(info)
