"""An audit of exactly-once delivery that outlives the workers: the samples each rank was dealt.

With ``DistributedConfig.sample_log_dir`` every rank appends JSON lines to
``attempt{A}-rank{R}.jsonl`` there, where ``A`` names this start of the job (rank 0's clock in
nanoseconds when the ranks met, which every rank of the start shares: torchrun's restart count
is per node, and a node that joins later counts from 0): one ``start`` line (time, host
name, pid, world, the round it resumed after); as each round starts, a ``round`` line with the
epoch, the global round, the ``[shard, index]`` pairs it was dealt and the bytes it had fetched until then
(written before the gradient is sent, so a rank killed after its gradient was used has logged
it); and an ``end`` line with the bytes fetched by the end of its training.

A round logged after the last checkpoint of an attempt was trained again by the next attempt;
:func:`delivered` keeps, for each attempt, only the rounds up to where the next one resumed, so
it lists what the final model was trained on.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

import torch

__all__ = ["SampleLog", "delivered", "read_sample_log"]


class SampleLog:
    """One rank's log file (line-buffered: a killed worker loses at most the round in flight)."""

    def __init__(
        self, directory: str | Path, *, attempt: int, rank: int, world: int, resumed_round: int
    ) -> None:
        self.attempt = attempt
        self.rank = rank
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"attempt{self.attempt}-rank{rank}.jsonl"
        self._file: IO[str] = path.open("a", buffering=1)
        self._write(
            {
                "event": "start",
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "world": world,
                "resumed_round": resumed_round,
            }
        )

    def _write(self, record: dict[str, Any]) -> None:
        record.update(t=time.time(), attempt=self.attempt, rank=self.rank)
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def round(
        self,
        epoch: int,
        global_round: int,
        shards: torch.Tensor,
        indices: torch.Tensor,
        wire_bytes: int,
    ) -> None:
        pairs = torch.stack([shards, indices], dim=1).tolist() if len(shards) else []
        self._write(
            {
                "event": "round",
                "epoch": epoch,
                "round": global_round,
                "samples": pairs,
                "wire_bytes": wire_bytes,
            }
        )

    def end(self, wire_bytes: int) -> None:
        self._write({"event": "end", "wire_bytes": wire_bytes})

    def close(self) -> None:
        self._file.close()


def read_sample_log(directory: str | Path) -> list[dict[str, Any]]:
    """Every record of every file in ``directory`` (a line cut short by a kill is skipped)."""
    records = []
    for path in sorted(Path(directory).glob("attempt*-rank*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def delivered(records: list[dict[str, Any]]) -> dict[int, list[tuple[int, int]]]:
    """Per epoch, the ``(shard, index)`` pairs the final model was trained on: each attempt's
    rounds up to the round the next attempt resumed after (no records: nothing delivered)."""
    resumed_at: dict[int, int] = {}
    for r in records:
        if r["event"] == "start":
            resumed_at[r["attempt"]] = r["resumed_round"]
    attempts = sorted(resumed_at)
    # The last attempt (and one without a start record) keeps every round it logged.
    keep_until = {a: resumed_at[b] for a, b in zip(attempts, attempts[1:], strict=False)}
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        if r["event"] != "round":
            continue
        limit = keep_until.get(r["attempt"])
        if limit is None or r["round"] <= limit:
            out[r["epoch"]].extend((int(s), int(i)) for s, i in r["samples"])
    return dict(out)
