"""Choosing the split by predicted time per iteration (HAPI's default rule).

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
``sum(stages) + (n - 1) * max(stages)``. Where the epoch's length is known the rule ranks the
splits by that epoch time, else by the steady-state iteration; on a short epoch (a few
iterations) the fill weighs, and a split whose first batch crosses a slow link with more bytes
loses to one that ships less, even when both are equally fast per iteration. The split with the
smallest predicted time wins, and among splits within 2 % of it the one that ships the fewest
bytes (a prediction is not more exact than that, and fewer bytes leave more of a shared link to
others). Unpacking frames on the client (zstd, float16 to float32) is not
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
    "ServerCosts",
    "StageTimes",
    "choose_split_by_time",
    "predict_stage_times",
]

log = logging.getLogger(__name__)

#: Splits predicted within this factor of the fastest count as equally fast.
TIE_TOLERANCE = 1.02


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

    @property
    def iteration_s(self) -> float:
        return max(self.server_s, self.wire_s, self.client_s)

    def epoch_s(self, iterations: int) -> float:
        """One epoch of ``iterations`` through the three-stage pipeline: the first batch passes
        every stage, each later one adds the slowest stage's time."""
        stages = (self.server_s, self.wire_s, self.client_s)
        return sum(stages) + (iterations - 1) * max(stages)

    def predicted_s(self, iterations: int | None) -> float:
        """What the rule ranks: an epoch of ``iterations``, or one steady-state iteration."""
        return self.iteration_s if iterations is None else self.epoch_s(iterations)

    @property
    def limiter(self) -> str:
        stages = {"server": self.server_s, "wire": self.wire_s, "client": self.client_s}
        return max(stages, key=lambda k: stages[k])

    def describe(self) -> str:
        return (
            f"split {self.split}: {self.iteration_s:.3f} s per iteration (server "
            f"{self.server_s:.3f} s, wire {self.wire_s:.3f} s for {self.wire_bytes / 1e6:.2f} MB, "
            f"client {self.client_s:.3f} s)"
        )


def predict_stage_times(
    server: ServerCosts,
    client: ClientCosts,
    stored_bytes_per_sample: float,
    batch_size: int,
    bandwidth_bytes_per_s: float,
    freeze_index: int,
) -> list[StageTimes]:
    """The predicted stages of every split ``0..freeze_index``."""
    if batch_size < 1:
        raise ConfigurationError(f"batch size must be >= 1, got {batch_size}")
    if bandwidth_bytes_per_s <= 0:
        raise ConfigurationError("bandwidth must be positive")
    if stored_bytes_per_sample <= 0:
        raise ConfigurationError("stored bytes per sample must be positive")
    measured = min(len(server.layer_s), len(server.encode_s), len(server.wire_bytes))
    if measured < freeze_index or len(client.layer_s) < freeze_index:
        raise ConfigurationError(
            f"costs cover {measured} server and {len(client.layer_s)} client layers; the freeze "
            f"index {freeze_index} needs both"
        )
    share = 1 + server.load
    tail = client.train_s * batch_size + client.step_s
    out: list[StageTimes] = []
    for s in range(freeze_index + 1):
        if s == 0:
            server_s = 0.0
            nbytes = stored_bytes_per_sample * batch_size
            client_s = (client.decode_s + sum(client.layer_s[:freeze_index])) * batch_size
        else:
            head = server.decode_s + sum(server.layer_s[:s]) + server.encode_s[s - 1]
            server_s = head * batch_size * share
            nbytes = server.wire_bytes[s - 1] * batch_size
            client_s = sum(client.layer_s[s:freeze_index]) * batch_size
        out.append(StageTimes(s, server_s, nbytes / bandwidth_bytes_per_s, client_s + tail, nbytes))
    return out


def choose_split_by_time(
    server: ServerCosts,
    client: ClientCosts,
    stored_bytes_per_sample: float,
    batch_size: int,
    bandwidth_bytes_per_s: float,
    freeze_index: int,
    iterations: int | None = None,
) -> SplitDecision:
    """The split with the smallest predicted time (see the module docstring): of an epoch of
    ``iterations`` where it is given, else of one steady-state iteration."""
    if iterations is not None and iterations < 1:
        raise ConfigurationError(f"an epoch needs at least one iteration, got {iterations}")
    times = predict_stage_times(
        server, client, stored_bytes_per_sample, batch_size, bandwidth_bytes_per_s, freeze_index
    )

    def predicted(t: StageTimes) -> float:
        return t.predicted_s(iterations)

    fastest = min(predicted(t) for t in times)
    near = [t for t in times if predicted(t) <= fastest * TIE_TOLERANCE]
    winner = min(near, key=lambda t: (t.wire_bytes, t.split))
    others = sorted((t for t in times if t.split != winner.split), key=predicted)
    over = "per iteration" if iterations is None else f"over an epoch of {iterations} iterations"
    reason = f"predicted fastest {over}, {winner.describe()}"
    if others:
        runner = others[0]
        reason += f"; runner-up {runner.describe()}"
        if predicted(runner) < predicted(winner):
            reason += (
                f" (within {TIE_TOLERANCE - 1:.0%} of each other, which a prediction cannot "
                "tell apart: the one shipping fewer bytes wins)"
            )
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
    )
    log.info("split index %d: %s", decision.split_index, decision.reason)
    return decision
