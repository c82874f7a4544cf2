"""Training checkpoints on disk: a safetensors file and the JSON that names it, written atomically.

Shared by the single-process recipe (:mod:`hapi_client.recipe_checkpoint`) and the multi-worker
trainer (:mod:`hapi_client.distributed.checkpoint`); each decides what goes in, this module
only how it lands on disk and how it is read back. A checkpoint directory holds
``checkpoint.json`` (everything that is not a tensor, plus the tensor file's name and sha256)
and that ``state-<label>.safetensors`` file. No pickle anywhere.

Writing is atomic: the tensors go to a new file, then ``checkpoint.json`` is replaced (each
through a temporary file in the same directory, fsynced, :func:`os.replace`), and only then are
older tensor files removed; a crash at any point leaves the previous checkpoint whole. Reading
checks the sha256, so a damaged file is a :class:`~hapi_client.errors.TrainingCheckpointError`
instead of weights trained on. The optimizer's state travels as JSON scalars plus tensors
(:func:`optimizer_to_parts`), never as a pickled ``state_dict``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from hapi_models.atomic_files import atomic_write
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import nn

from .errors import TrainingCheckpointError

__all__ = [
    "CHECKPOINT_FILE",
    "OPTIMIZER_PREFIX",
    "atomic_write",
    "check_fingerprint",
    "fingerprint_differences",
    "load_model_state",
    "optimizer_from_parts",
    "optimizer_to_parts",
    "read_checkpoint",
    "write_checkpoint",
]

CHECKPOINT_FILE = "checkpoint.json"
#: Key prefix of the optimizer's tensors in the safetensors file.
OPTIMIZER_PREFIX = "optim."
_TENSORS = "state-{label}.safetensors"
_TENSORS_GLOB = "state-*.safetensors"

T = TypeVar("T")


def _fsync_directory(directory: Path) -> None:
    # The renames are durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    directory: str | Path,
    *,
    label: str,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    format_version: int,
) -> Path:
    """Write ``tensors`` as ``state-<label>.safetensors`` and ``meta`` (JSON) as
    ``checkpoint.json`` naming it, atomically; returns the JSON file's path.

    ``label`` must differ from the current checkpoint's (a new position), so that a crash
    between the two renames leaves the old JSON next to its own, untouched tensor file.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    blob = save_tensors({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    name = _TENSORS.format(label=label)
    atomic_write(root / name, blob)
    header = {
        "format": format_version,
        "tensors": name,
        "tensors_sha256": hashlib.sha256(blob).hexdigest(),
    }
    path = root / CHECKPOINT_FILE
    atomic_write(path, json.dumps({**header, **meta}, indent=1, allow_nan=True).encode())
    _fsync_directory(root)
    for old in root.glob(_TENSORS_GLOB):
        if old.name != name:
            old.unlink(missing_ok=True)
    return path


def read_checkpoint(
    directory: str | Path,
    *,
    format_version: int,
    build: Callable[[dict[str, Any], dict[str, torch.Tensor]], T],
) -> T | None:
    """The checkpoint in ``directory`` as ``build(meta, tensors)``; None if it holds none.

    :class:`TrainingCheckpointError` if it is damaged: unreadable or malformed JSON, another
    format, a missing tensor file or one that does not match its sha256, or a ``build`` that
    finds fields missing or of the wrong type.
    """
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
        if meta.get("format") != format_version:
            raise TrainingCheckpointError(
                f"{path} has format {meta.get('format')!r}, expected {format_version}"
            )
        blob = (root / str(meta["tensors"])).read_bytes()
        if hashlib.sha256(blob).hexdigest() != meta["tensors_sha256"]:
            raise TrainingCheckpointError(
                f"{root / meta['tensors']} does not match its sha256 in {path}"
            )
        return build(meta, load_tensors(blob))
    except TrainingCheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError) as exc:
        raise TrainingCheckpointError(f"the checkpoint in {root} is damaged: {exc}") from exc


def fingerprint_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``"field: checkpoint X, this run Y"`` for each field where the two differ."""
    keys = sorted(set(saved) | set(current))
    return [
        f"{k}: checkpoint {saved.get(k)!r}, this run {current.get(k)!r}"
        for k in keys
        if saved.get(k) != current.get(k)
    ]


def check_fingerprint(
    saved: dict[str, Any], current: dict[str, Any], directory: str | Path
) -> None:
    """Raise :class:`TrainingCheckpointError` naming each field where this run differs."""
    diff = fingerprint_differences(saved, current)
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
                tensors[f"{OPTIMIZER_PREFIX}{index}.{name}"] = value.detach().cpu().clone()
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
        index, name = key.removeprefix(OPTIMIZER_PREFIX).split(".", 1)
        state.setdefault(int(index), {})[name] = value
    try:
        optimizer.load_state_dict({"state": state, "param_groups": parts["param_groups"]})
    except (KeyError, ValueError, RuntimeError) as exc:
        raise TrainingCheckpointError(
            f"the checkpoint's optimizer state does not fit: {exc}"
        ) from exc


def load_model_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy the checkpoint's parameters and buffers into ``module`` (its names and shapes)."""
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise TrainingCheckpointError(
            f"the checkpoint's model does not fit this run: {exc}"
        ) from exc
