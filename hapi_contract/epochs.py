"""The order in which an epoch visits samples, shared by every mode so they train identically.

Shards are visited in an order shuffled per epoch from the seed; the samples of a shard are
permuted from ``(seed, epoch, shard)``; consecutive samples form the training batches.

The permutations are torch's (``torch.randperm``), so that every mode draws the same ones.
Torch is imported inside the functions that draw them: importing this module loads none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["EpochPlan", "plan_epoch"]

_MASK = 0x7FFF_FFFF_FFFF


@dataclass(frozen=True)
class EpochPlan:
    seed: int
    epoch: int
    shard_order: tuple[int, ...]

    def permutation(self, shard: int, n: int) -> torch.Tensor:
        import torch

        g = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + self.epoch * 7_919 + shard) & _MASK
        )
        return torch.randperm(n, generator=g)

    def sample_order(self, shard_sizes: list[int]) -> list[tuple[int, int]]:
        """Every ``(shard, index within shard)`` of the epoch, in visiting order."""
        order = []
        for shard in self.shard_order:
            order += [(shard, int(i)) for i in self.permutation(shard, shard_sizes[shard])]
        return order


def plan_epoch(num_shards: int, seed: int, epoch: int, shuffle: bool = True) -> EpochPlan:
    if not shuffle:
        return EpochPlan(seed, epoch, tuple(range(num_shards)))
    import torch

    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) & _MASK)
    return EpochPlan(seed, epoch, tuple(torch.randperm(num_shards, generator=g).tolist()))
