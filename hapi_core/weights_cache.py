"""Loaded models shared by concurrent requests, keyed by weights sha256, arch, classes and device.

Correctness never depends on the cache: every request proves it may read the weights object
(a HEAD with the caller's token) and that the object is still the verified blob (its Swift etag,
the md5 of the bytes whose sha256 was checked); a miss fetches, verifies and loads. Idle entries
stay resident up to ``weights_cache_bytes`` and are counted as occupied device memory; the
scheduler evicts them when a planning round would otherwise defer a request.

A dropped model leaves the process only when the garbage collector finds it, not when the
last reference goes: every network cut at its torch.fx split points
(:mod:`hapi_models.graph_split`: ConvNeXt, ViT, every network not cut by hand) is held by
reference cycles (each layer's ``GraphModule`` and its ``Graph``, and the traced network the
layers were cut from), so its parameters stay resident until a full collection, which a
long-lived process runs rarely.
Issue 27: the in-proxy proxy evicted a ConvNeXt-L for a waiting ViT-L/16, its resident memory
stayed at 1573 MiB (1556 before), and the ViT-L/16 was refused 507 for memory outside the plan.
A ConvNeXt-T run and evicted in one process kept its 106 MiB resident after the eviction (RSS
945 MiB before and after; 845 MiB after a ``gc.collect()``); glibc's heap was not the cause
(``malloc_trim`` then gave back 12 MiB more). So the cache runs the collection itself while a
model it dropped is still alive (:meth:`WeightsCache.reclaim`): the same ConvNeXt-T left the
process at its eviction (RSS 954 to 845 MiB).
"""

from __future__ import annotations

import gc
import itertools
import logging
import weakref
from collections import OrderedDict
from collections.abc import Iterable
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


@dataclass(frozen=True)
class _Dropped:
    """A model the cache no longer holds, until its memory is gone from the process."""

    tensors: weakref.WeakSet[torch.Tensor]
    """Its parameters and buffers: the model object itself dies before them, whose modules
    the cycles hold."""
    nbytes: int
    device_name: str

    @classmethod
    def of(cls, entry: CachedModel) -> _Dropped:
        tensors = weakref.WeakSet(itertools.chain(entry.model.parameters(), entry.model.buffers()))
        return cls(tensors, entry.nbytes, entry.key[3])

    @property
    def alive(self) -> bool:
        return len(self.tensors) > 0


class WeightsCache:
    def __init__(self, idle_budget_bytes: int) -> None:
        self.idle_budget_bytes = idle_budget_bytes
        self._entries: OrderedDict[CacheKey, CachedModel] = OrderedDict()
        self._dropped: list[_Dropped] = []

    def resident_bytes(self, device: Device) -> int:
        return sum(e.nbytes for e in self._entries.values() if e.key[3] == device.name)

    def lookup(self, key: CacheKey) -> CachedModel | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def insert(
        self, key: CacheKey, model: hapi_models.SplittableModel, etag: str, extra_bytes: int = 0
    ) -> CachedModel:
        """``extra_bytes``: what the model's entry holds beside its tensors (the folded copies of
        its heads' convolutions), counted with them."""
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
            b.numel() * b.element_size() for b in model.buffers()
        )
        nbytes += extra_bytes
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
        if self._drop_all(self._over_budget()):
            self.reclaim()

    def _over_budget(self) -> list[CachedModel]:
        idle = self._idle()
        total = sum(e.nbytes for e in idle)
        victims = []
        for entry in idle:  # least recently used first
            if total <= self.idle_budget_bytes:
                break
            victims.append(entry)
            total -= entry.nbytes
        return victims

    def evict_idle(self, device: Device) -> int:
        freed = self._drop_all(self._idle(device.name))
        if freed:
            self.reclaim()
        return freed

    def _drop_all(self, entries: Iterable[CachedModel]) -> int:
        """Drop ``entries``; their bytes. Its own frame, so that no local of the caller's
        still holds one when :meth:`reclaim` looks."""
        freed = 0
        for entry in entries:
            self._entries.pop(entry.key, None)
            log.debug("evicted weights %s", entry.key)
            self._dropped.append(_Dropped.of(entry))
            # A finished request's response may still hold the entry a while; not the model.
            del entry.model
            freed += entry.nbytes
        return freed

    def reclaim(self) -> int:
        """Free the dropped models that only garbage still holds (a full collection, run only
        while one of them is alive); the bytes of those gone since the last call.

        A model still held for real (by a finished request's response not yet let go) stays
        listed, and goes at a later call: the scheduler calls this before it refuses a request
        for memory outside the plan. A full collection took 0.3-0.5 s with torch and a model
        loaded (two shared cores), as long as the interpreter's own full collections: it runs
        at an eviction that leaves a model alive and before such a refusal, never per request
        (a network cut by hand leaves no cycles, and no collection runs for it)."""
        gone = [d for d in self._dropped if not d.alive]
        alive = [d for d in self._dropped if d.alive]
        if alive:
            gc.collect()
            gone += [d for d in alive if not d.alive]
            alive = [d for d in alive if d.alive]
        self._dropped = alive
        if any(d.device_name.startswith("cuda") for d in gone):
            torch.cuda.empty_cache()  # the freed blocks go back to the driver, for others
        return sum(d.nbytes for d in gone)
