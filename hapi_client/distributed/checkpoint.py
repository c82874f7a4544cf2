"""Checkpoints of a multi-worker run: what a restarted (or resized) job resumes from.

A checkpoint directory holds ``checkpoint.json`` (the run's position and everything that is not a
tensor) and the safetensors file it names (the trainable tail's parameters and buffers, the
optimizer's tensors, the epoch's done mask). Rank 0 writes; every rank reads, so the directory
must be one all ranks see (a shared file system on a cluster). No pickle anywhere.

Writing is atomic: the tensors go to a new file, then ``checkpoint.json`` is replaced (each
through a temporary file in the same directory, fsynced, :func:`os.replace`), and only then are
older tensor files removed; a crash at any point leaves the previous checkpoint whole. The JSON
carries the tensor file's sha256, so a damaged file is refused instead of trained on.

The position is free of the world size (the epoch's progress is a mask over its samples, see
:meth:`~.schedule.EpochSchedule.done_mask`), so a job may resume with more or fewer workers. The
RNG needs no bytes of its own: every rank reseeds from ``(seed, rank, round)`` each round
(:func:`round_seed`), so the saved round is the RNG state. The fingerprint (model, weights,
dataset, split, freeze index, classes, image size, seed, optimizer) must match the run's, or
:class:`TrainingCheckpointError` says which fields differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import nn

from .config import DistributedConfig
from .errors import TrainingCheckpointError
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

CHECKPOINT_FILE = "checkpoint.json"
_FORMAT = 1
_TENSORS = "state-{round:09d}.safetensors"
_MODEL, _OPTIM, _DONE = "model.", "optim.", "epoch.done"


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
        keys = sorted(set(self.fingerprint) | set(fingerprint))
        diff = [
            f"{k}: checkpoint {self.fingerprint.get(k)!r}, this run {fingerprint.get(k)!r}"
            for k in keys
            if self.fingerprint.get(k) != fingerprint.get(k)
        ]
        if diff:
            raise TrainingCheckpointError(
                f"the checkpoint in {directory} belongs to another run ({'; '.join(diff)}); "
                "use another checkpoint directory or remove it to start over"
            )


def optimizer_to_parts(
    optimizer: torch.optim.Optimizer,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The optimizer's state as JSON (groups, scalars) and tensors (``optim.<param>.<name>``)."""
    state = optimizer.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    tensors: dict[str, torch.Tensor] = {}
    for index, values in state["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{_OPTIM}{index}.{name}"] = value.detach().cpu().clone()
            else:
                scalars.setdefault(str(index), {})[name] = value
    return {"param_groups": state["param_groups"], "scalars": scalars}, tensors


def optimizer_from_parts(
    optimizer: torch.optim.Optimizer, parts: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    """Load what :func:`optimizer_to_parts` produced into ``optimizer``."""
    state: dict[int, dict[str, Any]] = {}
    for index, values in parts.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(values)
    for key, value in tensors.items():
        index, name = key.removeprefix(_OPTIM).split(".", 1)
        state.setdefault(int(index), {})[name] = value
    try:
        optimizer.load_state_dict({"state": state, "param_groups": parts["param_groups"]})
    except (KeyError, ValueError, RuntimeError) as exc:
        raise TrainingCheckpointError(
            f"the checkpoint's optimizer state does not fit: {exc}"
        ) from exc


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: str | Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` atomically into ``directory``; returns the JSON file's path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tensors = {f"{_MODEL}{k}": v.detach().cpu().clone() for k, v in checkpoint.model.items()}
    tensors.update(checkpoint.optimizer_tensors)
    if checkpoint.done is not None:
        tensors[_DONE] = checkpoint.done.to(torch.bool).cpu().clone()
    blob = save_tensors(tensors)
    name = _TENSORS.format(round=checkpoint.global_round)
    _atomic_write(root / name, blob)
    meta = {
        "format": _FORMAT,
        "tensors": name,
        "tensors_sha256": hashlib.sha256(blob).hexdigest(),
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
    path = root / CHECKPOINT_FILE
    _atomic_write(path, json.dumps(meta, indent=1, allow_nan=True).encode())
    _fsync_directory(root)
    for old in root.glob("state-*.safetensors"):
        if old.name != name:
            old.unlink(missing_ok=True)
    return path


def load_checkpoint(directory: str | Path) -> Checkpoint | None:
    """The checkpoint in ``directory``, None if it holds none; :class:`TrainingCheckpointError` if damaged."""
    root = Path(directory)
    path = root / CHECKPOINT_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TrainingCheckpointError(f"cannot read {path}: {exc}") from exc
    try:
        meta = json.loads(text)
        if meta.get("format") != _FORMAT:
            raise TrainingCheckpointError(
                f"{path} has format {meta.get('format')!r}, expected {_FORMAT}"
            )
        blob = (root / str(meta["tensors"])).read_bytes()
        if hashlib.sha256(blob).hexdigest() != meta["tensors_sha256"]:
            raise TrainingCheckpointError(
                f"{root / meta['tensors']} does not match its sha256 in {path}"
            )
        tensors = load_tensors(blob)
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
            optimizer_tensors={k: v for k, v in tensors.items() if k.startswith(_OPTIM)},
            done=tensors.get(_DONE),
        )
    except TrainingCheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise TrainingCheckpointError(f"the checkpoint in {root} is damaged: {exc}") from exc


def load_model_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy the checkpoint's parameters and buffers into ``module`` (its names and shapes)."""
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise TrainingCheckpointError(
            f"the checkpoint's model does not fit this run: {exc}"
        ) from exc
