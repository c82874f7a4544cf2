"""Checkpoints of a multi-worker run: what a restarted (or resized) job resumes from.

A checkpoint directory holds ``checkpoint.json`` (the run's position and everything that is not a
tensor) and the safetensors file it names (the trainable tail's parameters and buffers, the
optimizer's tensors, the epoch's done mask). Rank 0 writes; every rank reads, so the directory
must be one all ranks see (a shared file system on a cluster). No pickle anywhere.

Writing is atomic and reading checks the tensor file's sha256: both are
:mod:`hapi_client.checkpoint_store`'s, shared with the single-process recipe.

The position is free of the world size (the epoch's progress is a mask over its samples, see
:meth:`~.schedule.EpochSchedule.done_mask`), so a job may resume with more or fewer workers. The
RNG needs no bytes of its own: every rank reseeds from ``(seed, rank, round)`` each round
(:func:`round_seed`), so the saved round is the RNG state. The fingerprint (model, weights,
dataset, split, freeze index, classes, image size, seed, optimizer) must match the run's, or
:class:`~hapi_client.errors.TrainingCheckpointError` says which fields differ.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..checkpoint_store import (
    CHECKPOINT_FILE,
    OPTIMIZER_PREFIX,
    check_fingerprint,
    load_model_state,
    optimizer_from_parts,
    optimizer_to_parts,
    read_checkpoint,
    write_checkpoint,
)
from .config import DistributedConfig
from .setup import Replica

__all__ = [
    "CHECKPOINT_FILE",
    "Checkpoint",
    "load_checkpoint",
    "load_model_state",
    "run_fingerprint",
    "optimizer_from_parts",
    "optimizer_to_parts",
    "round_seed",
    "save_checkpoint",
]

_FORMAT = 1
_MODEL, _DONE = "model.", "epoch.done"


def round_seed(seed: int, rank: int, global_round: int) -> int:
    """The torch seed of ``rank`` in round ``global_round``: a pure function, so a resumed run
    draws the same dropout masks (and forged gradients) as an uninterrupted one."""
    digest = hashlib.sha256(f"hapi-round:{seed}:{rank}:{global_round}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def run_fingerprint(config: DistributedConfig, replica: Replica) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it (the epochs, the world and the
    robustness settings may change)."""
    shards = [[s.etag, s.samples] for s in replica.manifest.shards]
    dataset = hashlib.sha256(json.dumps(shards).encode()).hexdigest()
    return {
        "model": config.model,
        "weights_sha256": replica.stored.sha256,
        "container": config.container,
        "dataset_sha256": dataset,
        "mode": config.mode,
        "split": replica.split,
        "freeze": replica.freeze,
        "num_classes": config.num_classes,
        "image_size": config.extract.image_size,
        "transform": str(replica.transform),
        "seed": config.train.seed,
        "optimizer": config.train.optimizer,
    }


@dataclass
class Checkpoint:
    """A run's position (JSON) and tensors; see the module docstring."""

    fingerprint: dict[str, Any]
    #: The epoch in progress (or, with ``rounds_done == 0`` and no mask, the next to start).
    epoch: int
    rounds_done: int
    global_round: int
    #: The world that wrote it, and the one the job started with (to keep ``n - q`` when resized).
    world_size: int
    first_world_size: int
    #: Each worker's share of the next round (valid in ``world_size`` only).
    assignment: list[int]
    #: Rank 0's running sums of the epoch in progress (see :class:`~.results.EpochStats`).
    stats: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    round_seconds: list[float] = field(default_factory=list)
    round_sizes: list[list[int]] = field(default_factory=list)
    optimizer: dict[str, Any] = field(default_factory=dict)
    model: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    done: torch.Tensor | None = None

    def check_fingerprint(self, fingerprint: dict[str, Any], directory: str | Path) -> None:
        """Raise :class:`TrainingCheckpointError` naming each field where this run differs."""
        check_fingerprint(self.fingerprint, fingerprint, directory)


def save_checkpoint(directory: str | Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` atomically into ``directory``; returns the JSON file's path."""
    tensors = {f"{_MODEL}{k}": v.detach().cpu().clone() for k, v in checkpoint.model.items()}
    tensors.update(checkpoint.optimizer_tensors)
    if checkpoint.done is not None:
        tensors[_DONE] = checkpoint.done.to(torch.bool).cpu().clone()
    meta = {
        "fingerprint": checkpoint.fingerprint,
        "epoch": checkpoint.epoch,
        "rounds_done": checkpoint.rounds_done,
        "global_round": checkpoint.global_round,
        "world_size": checkpoint.world_size,
        "first_world_size": checkpoint.first_world_size,
        "assignment": list(checkpoint.assignment),
        "stats": checkpoint.stats,
        "history": checkpoint.history,
        "round_seconds": checkpoint.round_seconds,
        "round_sizes": checkpoint.round_sizes,
        "optimizer": checkpoint.optimizer,
    }
    # The round is the label: each save is a new position (the epoch's last round is saved
    # once, at the epoch's end).
    return write_checkpoint(
        directory,
        label=f"{checkpoint.global_round:09d}",
        tensors=tensors,
        meta=meta,
        format_version=_FORMAT,
    )


def load_checkpoint(directory: str | Path) -> Checkpoint | None:
    """The checkpoint in ``directory``, None if it holds none; :class:`TrainingCheckpointError` if damaged."""
    return read_checkpoint(directory, format_version=_FORMAT, build=_from_parts)


def _from_parts(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Checkpoint:
    return Checkpoint(
        fingerprint=dict(meta["fingerprint"]),
        epoch=int(meta["epoch"]),
        rounds_done=int(meta["rounds_done"]),
        global_round=int(meta["global_round"]),
        world_size=int(meta["world_size"]),
        first_world_size=int(meta["first_world_size"]),
        assignment=[int(s) for s in meta["assignment"]],
        stats=dict(meta["stats"]),
        history=list(meta["history"]),
        round_seconds=[float(s) for s in meta["round_seconds"]],
        round_sizes=[[int(s) for s in row] for row in meta["round_sizes"]],
        optimizer=dict(meta["optimizer"]),
        model={k.removeprefix(_MODEL): v for k, v in tensors.items() if k.startswith(_MODEL)},
        optimizer_tensors={k: v for k, v in tensors.items() if k.startswith(OPTIMIZER_PREFIX)},
        done=tensors.get(_DONE),
    )
