"""Loaded models shared by concurrent requests, keyed by weights sha256, arch, classes and device.

Correctness never depends on the cache: every request proves it may read the weights object
(a HEAD with the caller's token) and that the object is still the verified blob (its Swift etag,
the md5 of the bytes whose sha256 was checked); a miss fetches, verifies and loads. Idle entries
stay resident up to ``weights_cache_bytes`` and are counted as occupied device memory; the
scheduler evicts them when a planning round would otherwise defer a request.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import hapi_models
import torch

from .devices import Device

log = logging.getLogger(__name__)

CacheKey = tuple[str, str, int, str]
"""(sha256, arch, num_classes, device name)"""


@dataclass
class CachedModel:
    key: CacheKey
    model: hapi_models.SplittableModel
    etag: str
    nbytes: int
    users: int = 0


class WeightsCache:
    def __init__(self, idle_budget_bytes: int) -> None:
        self.idle_budget_bytes = idle_budget_bytes
        self._entries: OrderedDict[CacheKey, CachedModel] = OrderedDict()

    def resident_bytes(self, device: Device) -> int:
        return sum(e.nbytes for e in self._entries.values() if e.key[3] == device.name)

    def lookup(self, key: CacheKey) -> CachedModel | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def insert(self, key: CacheKey, model: hapi_models.SplittableModel, etag: str) -> CachedModel:
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
            b.numel() * b.element_size() for b in model.buffers()
        )
        entry = CachedModel(key, model, etag, nbytes)
        self._entries[key] = entry
        return entry

    def acquire(self, entry: CachedModel) -> None:
        entry.users += 1

    def release(self, entry: CachedModel) -> None:
        entry.users -= 1
        self._trim()

    def _idle(self, device_name: str | None = None) -> list[CachedModel]:
        return [
            e
            for e in self._entries.values()
            if e.users == 0 and (device_name is None or e.key[3] == device_name)
        ]

    def _trim(self) -> None:
        idle = self._idle()
        total = sum(e.nbytes for e in idle)
        for entry in idle:  # least recently used first
            if total <= self.idle_budget_bytes:
                break
            self._drop(entry)
            total -= entry.nbytes

    def evict_idle(self, device: Device) -> int:
        freed = 0
        for entry in self._idle(device.name):
            self._drop(entry)
            freed += entry.nbytes
        return freed

    def _drop(self, entry: CachedModel) -> None:
        self._entries.pop(entry.key, None)
        log.debug("evicted weights %s", entry.key)
        if entry.key[3].startswith("cuda"):
            del entry.model
            torch.cuda.empty_cache()
