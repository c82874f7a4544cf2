"""Choosing the split by the predicted time of the whole job (HAPI's default rule).

Thesis Algorithm 2 (:mod:`hapi_client.planning.thesis_rule`) looks at bytes only: the earliest
layer whose output fits one second of bandwidth. What a user waits for is time, and a split moves
work as well as bytes: every layer before it runs on the server, every layer after it on the
client. So for every split ``s`` from 0 (raw streaming) to the freeze index this rule predicts
the three stages of the pipeline per training iteration of ``batch`` samples:

* **server**: decoding the stored images, layers ``[0, s)`` and encoding the features, measured
  on the server's own device (``POST /v1/timings``), scaled by ``1 + load`` when other requests
  share that device (each gets its share of it); 0 at split 0, where the server only reads;
* **wire**: the bytes of the split (the server's measured frame sizes at the wire dtype and
  compression; the stored shard bytes at split 0) over the measured bandwidth;
* **client**: layers ``[s, freeze)`` forward, and the trainable tail's forward, backward and
  optimizer step, measured once on the client's device; plus decoding at split 0.

The stages overlap (the client prefetches), so in the steady state an iteration takes the
slowest of the three. An epoch of ``n`` iterations also fills and drains the pipeline: its first
batch passes every stage before the steady state begins, so it takes
``sum(stages) + (n - 1) * max(stages)``.

What the rule ranks is the whole job the caller asked for (:class:`JobShape`): the first epoch
through the pipeline; every later epoch through it again, or, where the features are cached
(``cache_features`` on and no random augmentation before the split), from the client's feature
cache, which sends no request and ships nothing, so that a later epoch costs only the client's
layers ``[s, freeze)`` and the tail (split 0 is never cached: raw shards are read and decoded
every epoch); plus the seconds spent planning, the same for every split. So a many-epoch cached
job favours a split that leaves the client little to do, even where its first epoch is slower.
At an epoch boundary the split already run has its features in the cache
(``JobShape.cached_split``): every epoch left costs it a cached one, where another split would
extract them all again first; a drift of the link, which a cached epoch does not use, does not
make that worth it unless the cached epochs' client work does.
Without a job the rule ranks one epoch, or without its length one steady-state iteration.

A ``folder`` dataset's images are one object each: whoever runs layer 0 reads them one request
each, at the epoch's read concurrency, and those reads floor the stage that makes them (the
client's wire at split 0, the server's stage at the others), whatever the link's bandwidth.

The split with the smallest predicted time wins. Among splits within 2 % of it, which a
prediction cannot tell apart, the one that ships the fewest bytes wins (fewer bytes leave more
of a shared link to others), and where their bytes are the same (within 1 %), the fastest. The explanation
prints the figure ranked (the job's, an epoch's or an iteration's) and says so when the tie rule
overruled the fastest. Unpacking frames on the client (zstd, float16 to float32) is not
counted: it runs at gigabytes per second, far below the other stages.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigurationError
from .decision import SplitDecision

__all__ = [
    "ClientCosts",
    "JobShape",
    "ServerCosts",
    "StageTimes",
    "choose_split_by_time",
    "predict_stage_times",
]

log = logging.getLogger(__name__)

#: Splits predicted within this factor of the fastest count as equally fast.
TIE_TOLERANCE = 1.02
#: Wire bytes within this factor of the fewest count as the same: the demo's splits 8 and 9
#: shipped 1.23 MB each, a few hundred bytes apart, and the slower one won on them.
SAME_BYTES = 1.01


@dataclass(frozen=True)
class ServerCosts:
    """The server's measured costs per sample (from ``POST /v1/timings``)."""

    decode_s: float
    layer_s: Sequence[float]
    """Layer ``i``'s time per sample, for the layers measured (at least up to the freeze index)."""
    encode_s: Sequence[float]
    """Encoding the output of layer ``i`` for the wire, per sample."""
    wire_bytes: Sequence[float]
    """Bytes per sample a split after layer ``i`` ships, frames included."""
    load: int = 0
    device: str = "cpu"
    cached: bool = False
    """The server answered from timings kept from an earlier request, its head not run."""


@dataclass(frozen=True)
class ClientCosts:
    """The client's measured costs (once per model, freeze index and device)."""

    decode_s: float
    """Decoding and transforming one stored image (split 0 only)."""
    layer_s: Sequence[float]
    """Forward time of frozen layer ``i`` per sample, for ``i`` below the freeze index."""
    train_s: float
    """Forward and backward of the trainable tail, per sample."""
    step_s: float
    """One optimizer step over the tail's parameters, per iteration."""
    device: str = "cpu"


@dataclass(frozen=True)
class StageTimes:
    """Predicted seconds per training iteration of one split, per pipeline stage."""

    split: int
    server_s: float
    wire_s: float
    client_s: float
    wire_bytes: float
    """Bytes per iteration."""
    cached_iteration_s: float = 0.0
    """One iteration on cached features: the client's layers ``[split, freeze)`` and the tail."""

    @property
    def iteration_s(self) -> float:
        return max(self.server_s, self.wire_s, self.client_s)

    def epoch_s(self, iterations: int) -> float:
        """One epoch of ``iterations`` through the three-stage pipeline: the first batch passes
        every stage, each later one adds the slowest stage's time."""
        stages = (self.server_s, self.wire_s, self.client_s)
        return sum(stages) + (iterations - 1) * max(stages)

    def cached_epoch_s(self, iterations: int) -> float:
        """A later epoch served from the feature cache: no request, no transfer; the client
        runs layers ``[split, freeze)`` and the tail on the cached features. Split 0 is never
        cached (raw shards are read and decoded again every epoch)."""
        if self.split == 0:
            return self.epoch_s(iterations)
        return iterations * self.cached_iteration_s

    def predicted_s(self, iterations: int | None, job: JobShape | None = None) -> float:
        """What the rule ranks: the whole ``job`` where given; else an epoch of ``iterations``,
        or one steady-state iteration."""
        if job is not None:
            return self.job_s(job)
        return self.iteration_s if iterations is None else self.epoch_s(iterations)

    def job_s(self, job: JobShape) -> float:
        """The whole job: the first epoch through the pipeline, every later one from the
        feature cache where ``job.cached`` (else through the pipeline again), and planning;
        every epoch from the cache for the split whose features it already holds."""
        if self._from_cache(job):
            return job.planning_s + job.epochs * self.cached_epoch_s(job.iterations)
        later = self.cached_epoch_s if job.cached else self.epoch_s
        first = self.epoch_s(job.iterations)
        return job.planning_s + first + (job.epochs - 1) * later(job.iterations)

    def _from_cache(self, job: JobShape) -> bool:
        return job.cached and self.split != 0 and self.split == job.cached_split

    @property
    def limiter(self) -> str:
        stages = {"server": self.server_s, "wire": self.wire_s, "client": self.client_s}
        return max(stages, key=lambda k: stages[k])

    def stages(self) -> str:
        return (
            f"server {self.server_s:.3f} s, wire {self.wire_s:.3f} s for "
            f"{self.wire_bytes / 1e6:.2f} MB, client {self.client_s:.3f} s per iteration"
        )

    def describe(self, iterations: int | None = None, job: JobShape | None = None) -> str:
        """The figure the rule ranked first, then the stages it came from."""
        if job is not None and self._from_cache(job):
            return (
                f"split {self.split}: {self.job_s(job):.3f} s for the job (its features cached: "
                f"{self.cached_epoch_s(job.iterations):.3f} s per epoch; {self.stages()})"
            )
        if job is not None and job.epochs > 1:
            later = self.cached_epoch_s if job.cached else self.epoch_s
            return (
                f"split {self.split}: {self.job_s(job):.3f} s for the job (first epoch "
                f"{self.epoch_s(job.iterations):.3f} s, each later one "
                f"{later(job.iterations):.3f} s; {self.stages()})"
            )
        if job is not None or iterations is not None:
            n = job.iterations if job is not None else iterations
            assert n is not None
            return f"split {self.split}: {self.epoch_s(n):.3f} s per epoch ({self.stages()})"
        return f"split {self.split}: {self.iteration_s:.3f} s per iteration ({self.stages()})"


@dataclass(frozen=True)
class JobShape:
    """What the caller asked for, which the rule ranks the splits over."""

    iterations: int
    """Iterations per epoch."""
    epochs: int = 1
    cached: bool = False
    """Whether later epochs read the features from the client's feature cache (``cache_features``
    on, and no random augmentation in the frozen layers' input)."""
    planning_s: float = 0.0
    """Seconds already spent planning (the same for every split: it adds to the job's time, and
    to every split's alike)."""
    cached_split: int | None = None
    """The split whose features the cache already holds (at an epoch boundary, the one run so
    far, where ``cached``): every epoch left is a cached one for it."""

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ConfigurationError(
                f"an epoch needs at least one iteration, got {self.iterations}"
            )
        if self.epochs < 1:
            raise ConfigurationError(f"a job needs at least one epoch, got {self.epochs}")

    def describe(self) -> str:
        held = (
            f", split {self.cached_split}'s features in the cache"
            if self.cached and self.cached_split
            else ""
        )
        if self.epochs == 1:
            return f"over an epoch of {self.iterations} iterations{held}"
        cache = "features cached after the first" if self.cached else "no feature cache"
        return f"over a job of {self.epochs} epochs of {self.iterations} iterations ({cache}{held})"


def predict_stage_times(
    server: ServerCosts,
    client: ClientCosts,
    stored_bytes_per_sample: float,
    batch_size: int,
    bandwidth_bytes_per_s: float,
    freeze_index: int,
    read_s_per_sample: float = 0.0,
) -> list[StageTimes]:
    """The predicted stages of every split ``0..freeze_index``.

    ``read_s_per_sample``: a ``folder`` dataset's image reads, per sample at the epoch's read
    concurrency (one request per image costs Swift's per-request work whatever the link). Whoever
    runs layer 0 reads the images through Swift: the client at split 0 (a floor on its wire
    stage), the server at every other split (a floor on its stage).
    """
    if batch_size < 1:
        raise ConfigurationError(f"batch size must be >= 1, got {batch_size}")
    if bandwidth_bytes_per_s <= 0:
        raise ConfigurationError("bandwidth must be positive")
    if stored_bytes_per_sample <= 0:
        raise ConfigurationError("stored bytes per sample must be positive")
    if read_s_per_sample < 0:
        raise ConfigurationError("read time per sample must not be negative")
    measured = min(len(server.layer_s), len(server.encode_s), len(server.wire_bytes))
    if measured < freeze_index or len(client.layer_s) < freeze_index:
        raise ConfigurationError(
            f"costs cover {measured} server and {len(client.layer_s)} client layers; the freeze "
            f"index {freeze_index} needs both"
        )
    share = 1 + server.load
    tail = client.train_s * batch_size + client.step_s
    reads = read_s_per_sample * batch_size
    out: list[StageTimes] = []
    for s in range(freeze_index + 1):
        if s == 0:
            server_s = 0.0
            nbytes = stored_bytes_per_sample * batch_size
            client_s = (client.decode_s + sum(client.layer_s[:freeze_index])) * batch_size
            wire_s = max(nbytes / bandwidth_bytes_per_s, reads)
        else:
            head = server.decode_s + sum(server.layer_s[:s]) + server.encode_s[s - 1]
            server_s = max(head * batch_size * share, reads)
            nbytes = server.wire_bytes[s - 1] * batch_size
            client_s = sum(client.layer_s[s:freeze_index]) * batch_size
            wire_s = nbytes / bandwidth_bytes_per_s
        out.append(StageTimes(s, server_s, wire_s, client_s + tail, nbytes, client_s + tail))
    return out


def choose_split_by_time(
    server: ServerCosts,
    client: ClientCosts,
    stored_bytes_per_sample: float,
    batch_size: int,
    bandwidth_bytes_per_s: float,
    freeze_index: int,
    iterations: int | None = None,
    *,
    job: JobShape | None = None,
    read_s_per_sample: float = 0.0,
) -> SplitDecision:
    """The split with the smallest predicted time (see the module docstring): of the whole
    ``job`` where it is given, else of an epoch of ``iterations``, else of one steady-state
    iteration. Every split from 0 (BASELINE) to the freeze index is a candidate."""
    if iterations is not None and iterations < 1:
        raise ConfigurationError(f"an epoch needs at least one iteration, got {iterations}")
    if job is not None:
        iterations = job.iterations
    times = predict_stage_times(
        server,
        client,
        stored_bytes_per_sample,
        batch_size,
        bandwidth_bytes_per_s,
        freeze_index,
        read_s_per_sample,
    )

    def predicted(t: StageTimes) -> float:
        return t.predicted_s(iterations, job)

    # Planning is spent whichever split wins: the tie band is a share of the time the splits
    # differ in, or a long planning would widen it past what a prediction can tell apart.
    shared_s = job.planning_s if job is not None else 0.0

    def differing(t: StageTimes) -> float:
        return predicted(t) - shared_s

    fastest = min(times, key=lambda t: (predicted(t), t.split))
    near = [t for t in times if differing(t) <= differing(fastest) * TIE_TOLERANCE]
    # Among splits a prediction cannot tell apart, the one shipping the fewest bytes leaves
    # more of a shared link to others; where the bytes are the same, the fastest stays.
    fewest = min(t.wire_bytes for t in near)
    lean = [t for t in near if t.wire_bytes <= fewest * SAME_BYTES]
    winner = min(lean, key=lambda t: (predicted(t), t.split))
    if job is not None:
        over = job.describe()
    elif iterations is None:
        over = "per iteration"
    else:
        over = f"over an epoch of {iterations} iterations"
    reason = f"predicted fastest {over}, {winner.describe(iterations, job)}"
    if winner.split != fastest.split:
        gain = 1 - differing(fastest) / differing(winner)
        reason += (
            f"; runner-up {fastest.describe(iterations, job)}, predicted {gain:.1%} faster"
            f"{' (planning aside, which every split shares)' if shared_s else ''}: "
            f"within the {TIE_TOLERANCE - 1:.0%} a prediction cannot tell apart, and it ships "
            f"{fastest.wire_bytes / winner.wire_bytes - 1:.0%} more bytes "
            f"({fastest.wire_bytes / 1e6:.3f} MB against {winner.wire_bytes / 1e6:.3f} MB per "
            "iteration): the one shipping fewer bytes wins"
        )
    else:
        others = sorted((t for t in times if t.split != winner.split), key=predicted)
        if others:
            reason += f"; runner-up {others[0].describe(iterations, job)}"
    if read_s_per_sample > 0:
        reason += f"; image reads {read_s_per_sample * 1e3:.1f} ms per sample"
    reason += (
        f" [server on {server.device}"
        f"{f' shared with {server.load} other requests' if server.load else ''}, client on "
        f"{client.device}, {bandwidth_bytes_per_s * 8e-6:.1f} Mbit/s]"
    )
    decision = SplitDecision(
        winner.split,
        reason,
        stored_bytes_per_sample * batch_size,
        winner.wire_bytes,
        bandwidth_bytes_per_s,
        tuple(range(freeze_index + 1)),
        rule="time",
        predictions=tuple(times),
        iterations=iterations,
        job=job,
    )
    log.info("split index %d: %s", decision.split_index, decision.reason)
    return decision
