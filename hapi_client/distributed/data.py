"""A worker's shard features: prefetched in background threads, indexed by the schedule's slices."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ..errors import DeliveryError
from ..pipeline import LoadedShard, ShardLoader

__all__ = ["ShardStore"]

log = logging.getLogger(__name__)


class ShardStore:
    """Loads shards through ``loader`` (HAPI features or raw images) and hands out sample rows.

    Keeps at most ``capacity`` shards in memory (least recently used go first; the client's
    :class:`~hapi_client.FeatureCache` behind the loader still avoids a second extraction) and
    counts the bytes and requests the loads cost.
    """

    def __init__(
        self,
        loader: ShardLoader,
        shard_sizes: Sequence[int],
        executor: ThreadPoolExecutor,
        *,
        capacity: int = 8,
    ) -> None:
        self._loader = loader
        self._sizes = list(shard_sizes)
        self._executor = executor
        self.capacity = max(1, capacity)
        self._futures: OrderedDict[int, Future[LoadedShard]] = OrderedDict()
        self._counted: set[int] = set()
        self.wire_bytes = 0
        self.requests = 0

    def prefetch(self, shards: Iterable[int]) -> None:
        for shard in shards:
            if shard not in self._futures:
                self._futures[shard] = self._executor.submit(self._loader, shard)
                self._evict()

    def _evict(self) -> None:
        while len(self._futures) > self.capacity:
            shard, future = next(iter(self._futures.items()))
            if not future.done():
                return  # never drop a load in flight; it is needed soon
            del self._futures[shard]
            self._counted.discard(shard)

    def get(self, shard: int) -> LoadedShard:
        if shard not in self._futures:
            self.prefetch([shard])
        self._futures.move_to_end(shard)
        loaded = self._futures[shard].result()
        n = len(loaded.labels)
        if n != self._sizes[shard] or loaded.inputs.shape[0] != n:
            raise DeliveryError(
                f"shard {shard} delivered {n} samples, the manifest says {self._sizes[shard]}"
            )
        if shard not in self._counted:
            self._counted.add(shard)
            self.wire_bytes += loaded.wire_bytes
            self.requests += loaded.requests
        return loaded

    def rows(
        self, shards: torch.Tensor, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and labels of samples ``(shards[i], indices[i])``, in that order."""
        if len(shards) == 0:
            raise DeliveryError("asked for an empty slice")
        ids, counts = torch.unique_consecutive(shards, return_counts=True)
        xs, ys = [], []
        offset = 0
        for shard, count in zip(ids.tolist(), counts.tolist(), strict=True):
            loaded = self.get(int(shard))
            idx = indices[offset : offset + count]
            xs.append(loaded.inputs[idx])
            ys.append(loaded.labels[idx])
            offset += count
        return (torch.cat(xs) if len(xs) > 1 else xs[0]), (torch.cat(ys) if len(ys) > 1 else ys[0])

    def clear(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        self._counted.clear()
