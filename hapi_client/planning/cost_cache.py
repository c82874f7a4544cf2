"""The client's measured layer costs, kept on local disk for the next run.

Timing the frozen layers and the tail on the client takes seconds (GoogLeNet at 224 px: about
ten on a 2-core CPU), and the answer is the same for the same model on the same machine: the
architecture, the class count, the input transform, the freeze index, the timed batch, the
device, the torch version and its thread count. Keyed by all of them, the costs are kept in
``client-costs.json`` in HAPI's cache directory (``$HAPI_CACHE_DIR``, else the user's cache), so
a new process plans without timing them again. JSON, never pickle; a file that cannot be read
or does not hold what is expected is a miss, never an error (the costs are measured again).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import threading
from pathlib import Path
from typing import Any

import hapi_models
import torch
from hapi_models.atomic_files import atomic_write
from hapi_models.listing_cache import cache_dir

__all__ = ["COST_FILE", "KeptCosts", "cost_key", "read_costs", "write_costs"]

log = logging.getLogger(__name__)

COST_FILE = "client-costs.json"
#: Entries kept (the most recent): far more models than one user fine-tunes.
MAX_ENTRIES = 256

_lock = threading.Lock()
#: Bumped when the costs are measured differently: older entries are then simply not found.
#: 2: the frozen layers timed as they run (folded, in the faster layout), not contiguous.
_FORMAT = 2


@dataclasses.dataclass(frozen=True)
class KeptCosts:
    """What is kept: the per-layer forward times, the tail's train time and the step."""

    layer_s: list[float]
    train_s: float
    step_s: float


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cost_key(
    net: hapi_models.SplittableModel,
    transform: hapi_models.InputTransform,
    freeze_index: int,
    device: torch.device,
    batch: int,
) -> str:
    """Everything the client's costs depend on, as one string."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model()
    return json.dumps(
        [
            _FORMAT,
            net.arch,
            net.num_classes,
            dataclasses.asdict(transform),
            freeze_index,
            str(device),
            where,
            batch,
            torch.__version__,
            torch.get_num_threads(),
            os.cpu_count(),
        ],
        sort_keys=True,
        default=str,
    )


def _path() -> Path:
    return cache_dir() / COST_FILE


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_costs(key: str) -> KeptCosts | None:
    """The kept costs for ``key``; None when none are (or the file is unreadable)."""
    entry = _load(_path()).get(key)
    try:
        layer_s = [float(x) for x in entry["layer_s"]]  # type: ignore[index]
        return KeptCosts(layer_s, float(entry["train_s"]), float(entry["step_s"]))  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None


def write_costs(key: str, costs: KeptCosts) -> None:
    """Keep ``costs`` for ``key`` (the oldest entries beyond ``MAX_ENTRIES`` dropped). A cache
    that cannot be written is logged and skipped: the run goes on without it."""
    path = _path()
    with _lock:
        entries = _load(path)
        entries.pop(key, None)
        entries[key] = dataclasses.asdict(costs)
        while len(entries) > MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(entries).encode())
        except OSError as exc:
            log.warning("the client's costs were not kept in %s: %s", path, exc)
