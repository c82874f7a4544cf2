"""Features kept across epochs when the frozen layers see no random augmentation.

Keyed by everything that determines the features: the shard's etag, the weights' sha256, the
split index, the input transform and the wire dtype. With the cache on, a later epoch sends no
extraction request for a shard already seen. :class:`~hapi_client.DiskFeatureCache`
(:mod:`hapi_client.feature_store`) puts this LRU in front of files on local disk, which the
processes of a node share and a restarted process finds again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

CacheKey = tuple[str, str, int, str, str]


@dataclass(frozen=True)
class CachedFeatures:
    features: torch.Tensor
    labels: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.features.numel() * self.features.element_size() + self.labels.numel() * 8


class FeatureCache:
    """An LRU of shard features bounded in bytes; thread-safe."""

    def __init__(self, max_bytes: int = 4 * 2**30) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, CachedFeatures] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(etag: str, sha256: str, split: int, transform: str, dtype: str) -> CacheKey:
        return (etag, sha256, split, transform, dtype)

    def get(self, key: CacheKey) -> CachedFeatures | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: CacheKey, entry: CachedFeatures) -> None:
        if entry.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = entry
            self._bytes += entry.nbytes
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
