"""Which samples each worker trains on, round by round: one plan every rank computes alike.

Every rank derives the same schedule from the seed, the manifest and the per-round batch sizes
(which the aggregator broadcasts), so no sample list ever travels between workers:

- **Ownership** (fixed for the whole run): shard ``s`` belongs to the worker that holds the
  fewest samples when the shards are dealt in index order (round robin for equal shards). A
  worker fetches its own shards through HAPI, so with the feature cache every shard is
  extracted once per run, by one worker.
- **Streams** (per epoch): worker ``r``'s stream is its shards in the epoch plan's shard order
  (:func:`hapi_contract.epochs.plan_epoch`), each in the plan's per-shard permutation.
- **Rounds**: a round consumes ``sizes[r]`` samples for each worker ``r`` (the global batch
  ``sum(sizes)`` never changes; only the last round of an epoch differs, see
  :func:`round_totals`). A worker takes from the head of its own stream; when that runs dry
  (its share outgrew its shards under LB-BSP, or the shards do not divide evenly) it takes
  the rest from the *tail* of the stream with the most samples left, fetching that shard too.
  Every sample of the epoch is used exactly once across the workers.
- **Resuming** (after a restart, maybe with another number of workers): the epoch's progress is
  a mask over its samples (:meth:`EpochSchedule.done_mask`, indexed by shard then index within
  the shard, so it does not depend on the world); a resumed schedule keeps only the samples
  not yet done, and its rounds are :func:`resumed_totals`. With the same world and the same
  owners the streams resume exactly where they stopped (a prefix and a suffix of each stream
  were consumed), so the rounds are those an uninterrupted run would have trained; with another
  world the remaining samples are dealt again (:func:`remaining_sizes` to
  :func:`assign_shards`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hapi_contract.epochs import EpochPlan

from .errors import ScheduleError

__all__ = [
    "EpochSchedule",
    "Segment",
    "assign_shards",
    "remaining_sizes",
    "resumed_totals",
    "round_totals",
    "scale_sizes",
]


@dataclass(frozen=True)
class Segment:
    """Positions ``[start, stop)`` of worker ``stream``'s stream for this epoch."""

    stream: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def assign_shards(shard_sizes: Sequence[int], n_workers: int) -> list[list[int]]:
    """Shards per worker: dealt in index order to whoever holds the fewest samples (ties: lowest rank)."""
    if n_workers < 1:
        raise ScheduleError(f"need at least one worker, got {n_workers}")
    owned: list[list[int]] = [[] for _ in range(n_workers)]
    load = [0] * n_workers
    for shard, size in enumerate(shard_sizes):
        worker = min(range(n_workers), key=lambda r: (load[r], r))
        owned[worker].append(shard)
        load[worker] += size
    return owned


def round_totals(total: int, global_batch: int, n_workers: int) -> list[int]:
    """Samples per round of an epoch of ``total`` samples: ``global_batch`` each, except the last.

    A last partial round smaller than ``n_workers`` (it could not give every worker a sample)
    is merged into the one before it, so every sample is still used once.
    """
    if global_batch < n_workers:
        raise ScheduleError(
            f"a global batch of {global_batch} cannot give {n_workers} workers a sample each"
        )
    if total < n_workers:
        raise ScheduleError(
            f"an epoch of {total} samples cannot give {n_workers} workers a sample each"
        )
    full, rest = divmod(total, global_batch)
    if rest == 0:
        return [global_batch] * full
    if full == 0 or rest >= n_workers:
        return [global_batch] * full + [rest]
    return [global_batch] * (full - 1) + [global_batch + rest]


def resumed_totals(
    epoch_total: int, rounds_done: int, remaining: int, global_batch: int, n_workers: int
) -> list[int]:
    """The rounds left in an epoch of ``epoch_total`` samples after ``rounds_done`` rounds.

    The rest of the uninterrupted epoch's :func:`round_totals` when they cover the ``remaining``
    samples and give each of ``n_workers`` one (always so in the same world), else the
    ``remaining`` samples cut afresh.
    """
    full = round_totals(epoch_total, global_batch, n_workers)[rounds_done:]
    if sum(full) == remaining and all(t >= n_workers for t in full):
        return full
    if remaining == 0:
        return []
    return round_totals(remaining, global_batch, n_workers)


def remaining_sizes(shard_sizes: Sequence[int], done: torch.Tensor | None) -> list[int]:
    """Samples of each shard not yet ``done`` this epoch (``done``: see :meth:`EpochSchedule.done_mask`)."""
    if done is None:
        return list(shard_sizes)
    left = []
    offset = 0
    for size in shard_sizes:
        left.append(size - int(done[offset : offset + size].sum()))
        offset += size
    return left


def scale_sizes(sizes: Sequence[int], total: int) -> list[int]:
    """``sizes`` rescaled to sum to ``total`` (largest remainders), every worker keeping >= 1."""
    n = len(sizes)
    current = sum(sizes)
    if n == 0 or current <= 0:
        raise ScheduleError(f"cannot scale batch sizes {list(sizes)}")
    if total < n:
        raise ScheduleError(f"{total} samples cannot give {n} workers one each")
    if current == total:
        return list(sizes)
    quotas = [s * total / current for s in sizes]
    out = [max(1, int(q)) for q in quotas]
    diff = total - sum(out)
    # Hand out (or take back) single samples by how far each worker is from its exact quota.
    while diff > 0:
        i = max(range(n), key=lambda r: (quotas[r] - out[r], -r))
        out[i] += 1
        diff -= 1
    while diff < 0:
        i = max((r for r in range(n) if out[r] > 1), key=lambda r: (out[r] - quotas[r], -r))
        out[i] -= 1
        diff += 1
    return out


class EpochSchedule:
    """The sample streams of one epoch and the round-by-round slices cut from them."""

    def __init__(
        self,
        plan: EpochPlan,
        shard_sizes: Sequence[int],
        owners: Sequence[Sequence[int]],
        *,
        done: torch.Tensor | None = None,
    ) -> None:
        self.plan = plan
        self.n_workers = len(owners)
        self.shard_sizes = list(shard_sizes)
        self.epoch_samples = sum(self.shard_sizes)
        self._offsets = [0]
        for size in self.shard_sizes[:-1]:
            self._offsets.append(self._offsets[-1] + size)
        if done is not None and (done.dtype != torch.bool or done.shape != (self.epoch_samples,)):
            raise ScheduleError(
                f"the epoch's done mask must be {self.epoch_samples} booleans, "
                f"got {done.dtype} of shape {tuple(done.shape)}"
            )
        self._done_before = (
            torch.zeros(self.epoch_samples, dtype=torch.bool) if done is None else done.clone()
        )
        position = {s: i for i, s in enumerate(plan.shard_order)}
        self._shards: list[torch.Tensor] = []
        self._indices: list[torch.Tensor] = []
        for owned in owners:
            ordered = sorted(owned, key=lambda s: position[s])
            shards, perms = [], []
            for s in ordered:
                perm = plan.permutation(s, shard_sizes[s])
                if done is not None:
                    perm = perm[~done[self._offsets[s] + perm]]
                shards.append(torch.full((len(perm),), s, dtype=torch.int64))
                perms.append(perm)
            self._shards.append(torch.cat(shards) if shards else torch.empty(0, dtype=torch.int64))
            self._indices.append(torch.cat(perms) if perms else torch.empty(0, dtype=torch.int64))
        self._heads = [0] * self.n_workers
        self._tails = [len(s) for s in self._shards]
        #: Samples this schedule deals (the whole epoch, or what a resumed one had left).
        self.total = sum(self._tails)
        covered = self.total + int(self._done_before.sum())
        if covered != self.epoch_samples:
            raise ScheduleError(
                f"the owners cover {covered} of the epoch's {self.epoch_samples} samples"
            )

    def done_mask(self) -> torch.Tensor:
        """Which samples of the epoch are done (given before, or consumed since), world-free:
        ``mask[offset(shard) + index]`` with shards in index order."""
        mask = self._done_before.clone()
        for r in range(self.n_workers):
            for part in (slice(0, self._heads[r]), slice(self._tails[r], None)):
                shards = self._shards[r][part]
                if len(shards):
                    offsets = torch.tensor(self._offsets, dtype=torch.int64)[shards]
                    mask[offsets + self._indices[r][part]] = True
        return mask

    @property
    def remaining(self) -> int:
        return sum(t - h for h, t in zip(self._heads, self._tails, strict=True))

    def take(self, sizes: Sequence[int]) -> list[list[Segment]]:
        """Consume one round: ``sizes[r]`` samples for worker ``r``; returns each worker's segments."""
        if len(sizes) != self.n_workers or any(s < 0 for s in sizes):
            raise ScheduleError(f"expected {self.n_workers} batch sizes >= 0, got {list(sizes)}")
        if sum(sizes) > self.remaining:
            raise ScheduleError(
                f"round wants {sum(sizes)} samples, only {self.remaining} left in the epoch"
            )
        out: list[list[Segment]] = [[] for _ in range(self.n_workers)]
        deficit = []
        for r, want in enumerate(sizes):
            own = min(want, self._tails[r] - self._heads[r])
            if own:
                out[r].append(Segment(r, self._heads[r], self._heads[r] + own))
                self._heads[r] += own
            deficit.append(want - own)
        for r, need in enumerate(deficit):
            while need > 0:
                donor = max(
                    range(self.n_workers), key=lambda j: (self._tails[j] - self._heads[j], -j)
                )
                amount = min(need, self._tails[donor] - self._heads[donor])
                out[r].append(Segment(donor, self._tails[donor] - amount, self._tails[donor]))
                self._tails[donor] -= amount
                need -= amount
        return out

    def samples(self, segments: Sequence[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(shard ids, indices within the shard)`` of the segments, in order."""
        if not segments:
            empty = torch.empty(0, dtype=torch.int64)
            return empty, empty
        shards = torch.cat([self._shards[s.stream][s.start : s.stop] for s in segments])
        indices = torch.cat([self._indices[s.stream][s.start : s.stop] for s in segments])
        return shards, indices

    def foreign_shards(self, worker: int, round_sizes: Sequence[Sequence[int]]) -> list[int]:
        """Shards of *other* workers' streams that ``worker`` will take in the rounds ``round_sizes``.

        A dry run on a copy of the schedule (nothing is consumed), in the order of first need:
        the worker prefetches them early, so taking over another worker's samples under LB-BSP
        does not stall a round on an extraction.
        """
        heads, tails = list(self._heads), list(self._tails)
        needed: list[int] = []
        try:
            for sizes in round_sizes:
                for segment in self.take(sizes)[worker]:
                    if segment.stream != worker:
                        stream = self._shards[segment.stream][segment.start : segment.stop]
                        for shard in torch.unique_consecutive(stream).tolist():
                            if shard not in needed:
                                needed.append(int(shard))
        finally:
            self._heads, self._tails = heads, tails
        return needed

    def upcoming_shards(self, worker: int, count: int) -> list[int]:
        """The next ``count`` distinct shards at the head of ``worker``'s stream (for prefetching)."""
        stream = self._shards[worker][self._heads[worker] : self._tails[worker]]
        if len(stream) == 0 or count < 1:
            return []
        unique = torch.unique_consecutive(stream)
        return [int(s) for s in unique[:count]]
