"""Checkpoints of the single-process recipe (:func:`~hapi_client.finetune.run_finetune`).

What a killed ``hapi finetune`` resumes from: the trainable tail's parameters and buffers
(layers ``[freeze, n)``; the frozen ones are the stored weights), the optimizer's state, the
:class:`~hapi_client.FeatureDataset`'s position (:meth:`~hapi_client.FeatureDataset.state_dict`:
the epoch and the batches of it already trained, so nothing is lost or repeated), the running
sums of the epoch in progress, the history so far and the torch RNG state (the dropout masks to
come). The files are :mod:`hapi_client.checkpoint_store`'s: atomic, sha256-checked, no pickle.

The fingerprint names what must not change between the run that wrote a checkpoint and the one
resuming it: model, weights, dataset, split choice, freeze index, classes, image size,
transform, seed, optimizer, batch size and mode. The number of epochs may grow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint_store import (
    OPTIMIZER_PREFIX,
    check_fingerprint,
    load_model_state,
    optimizer_from_parts,
    optimizer_to_parts,
    read_checkpoint,
    write_checkpoint,
)
from .errors import ConfigurationError, TrainingCheckpointError
from .feature_dataset import FeatureDataset, LocalModel
from .options import ExtractOptions, TrainOptions
from .preparation import PreparedModel

__all__ = [
    "EpochSums",
    "RecipeCheckpoint",
    "RecipeCheckpointer",
    "load_recipe_checkpoint",
    "load_trainable_state",
    "recipe_fingerprint",
    "save_recipe_checkpoint",
    "trainable_state",
]

log = logging.getLogger(__name__)

_FORMAT = 1
_MODEL, _RNG = "tail.", "rng.torch"


@dataclass
class EpochSums:
    """The epoch in progress so far: what its :class:`~hapi_client.EpochMetrics` adds up."""

    loss_sum: float = 0.0
    correct: int = 0
    samples: int = 0
    iterations: int = 0
    wire_bytes: int = 0
    requests: int = 0
    verified_samples: int = 0
    #: Training seconds of the epoch before the restart (the time down is not counted).
    seconds: float = 0.0
    #: Seconds from the epoch's start to its first batch, as the first attempt measured it.
    first_batch_s: float | None = None


@dataclass
class RecipeCheckpoint:
    """Where a single-process run stands; see the module docstring."""

    fingerprint: dict[str, Any]
    #: The epoch in progress; with ``dataset["batches_done"] == 0`` the next one to start.
    epoch: int
    #: Training iterations of the whole run so far (what ``checkpoint_every`` counts).
    iteration: int
    #: :meth:`~hapi_client.FeatureDataset.state_dict` of the training dataset.
    dataset: dict[str, Any]
    sums: EpochSums = field(default_factory=EpochSums)
    #: :class:`~hapi_client.EpochMetrics` of the finished epochs, as dicts.
    history: list[dict[str, Any]] = field(default_factory=list)
    optimizer: dict[str, Any] = field(default_factory=dict)
    model: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    rng: torch.Tensor | None = None

    @property
    def batches_done(self) -> int:
        return int(self.dataset.get("batches_done", 0))

    def check_fingerprint(self, fingerprint: dict[str, Any], directory: str | Path) -> None:
        """Raise :class:`TrainingCheckpointError` naming each field where this run differs."""
        check_fingerprint(self.fingerprint, fingerprint, directory)


def recipe_fingerprint(
    prepared: PreparedModel,
    container: str,
    *,
    mode: str,
    train: TrainOptions,
    extract: ExtractOptions,
) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it (JSON values only)."""
    shards = [[s.etag, s.samples] for s in prepared.manifest.shards]
    return {
        "model": f"{prepared.stored.container}/{prepared.stored.arch}",
        "weights_sha256": prepared.stored.sha256,
        "container": container,
        "dataset_sha256": hashlib.sha256(json.dumps(shards).encode()).hexdigest(),
        "mode": mode,
        # The choice, not the index: "auto" may pick another split after a restart, and the
        # dataset's state then finishes the epoch on the saved one.
        "split": extract.split,
        "freeze": prepared.freeze_index,
        "num_classes": prepared.num_classes,
        "image_size": extract.image_size,
        "transform": str(prepared.transform),
        "seed": train.seed,
        "optimizer": dataclasses.asdict(train.optimizer_config()),
        "batch_size": train.batch_size,
    }


def _tail(local: LocalModel) -> nn.ModuleList:
    # The same modules, numbered from the freeze index: loading into it loads into the model.
    return nn.ModuleList(list(local.model.layers)[local.freeze_index :])


def trainable_state(local: LocalModel) -> dict[str, torch.Tensor]:
    """Parameters and buffers of layers ``[freeze, n)``: what training changes."""
    return {k: v.detach().cpu().clone() for k, v in _tail(local).state_dict().items()}


def load_trainable_state(local: LocalModel, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`trainable_state`'s output into ``local`` (:class:`TrainingCheckpointError`
    if the layers' names or shapes differ)."""
    load_model_state(_tail(local), state)


def save_recipe_checkpoint(directory: str | Path, checkpoint: RecipeCheckpoint) -> Path:
    """Write ``checkpoint`` atomically into ``directory``; returns the JSON file's path."""
    tensors = {f"{_MODEL}{k}": v for k, v in checkpoint.model.items()}
    tensors.update(checkpoint.optimizer_tensors)
    if checkpoint.rng is not None:
        tensors[_RNG] = checkpoint.rng
    meta = {
        "fingerprint": checkpoint.fingerprint,
        "epoch": checkpoint.epoch,
        "iteration": checkpoint.iteration,
        "dataset": checkpoint.dataset,
        "sums": dataclasses.asdict(checkpoint.sums),
        "history": checkpoint.history,
        "optimizer": checkpoint.optimizer,
    }
    # (epoch, batches done) is unique per position: an epoch's end is (epoch + 1, 0), never
    # the label of the mid-epoch checkpoint before it.
    label = f"{checkpoint.epoch:05d}-{checkpoint.batches_done:09d}"
    return write_checkpoint(
        directory, label=label, tensors=tensors, meta=meta, format_version=_FORMAT
    )


def load_recipe_checkpoint(directory: str | Path) -> RecipeCheckpoint | None:
    """The checkpoint in ``directory``, None if it holds none; :class:`TrainingCheckpointError`
    if it is damaged."""
    return read_checkpoint(directory, format_version=_FORMAT, build=_from_parts)


def _from_parts(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> RecipeCheckpoint:
    rng = tensors.get(_RNG)
    if rng is not None and rng.dtype != torch.uint8:
        raise TrainingCheckpointError(f"the saved RNG state is {rng.dtype}, not uint8")
    return RecipeCheckpoint(
        fingerprint=dict(meta["fingerprint"]),
        epoch=int(meta["epoch"]),
        iteration=int(meta["iteration"]),
        dataset=dict(meta["dataset"]),
        sums=EpochSums(**meta["sums"]),
        history=list(meta["history"]),
        optimizer=dict(meta["optimizer"]),
        model={k.removeprefix(_MODEL): v for k, v in tensors.items() if k.startswith(_MODEL)},
        optimizer_tensors={k: v for k, v in tensors.items() if k.startswith(OPTIMIZER_PREFIX)},
        rng=rng,
    )


class RecipeCheckpointer:
    """Writes the recipe's checkpoints into ``directory`` (every ``every`` iterations and at
    each epoch's end) and restores a run from one."""

    def __init__(
        self,
        directory: Path,
        every: int | None,
        fingerprint: dict[str, Any],
        dataset: FeatureDataset,
        local: LocalModel,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        self.directory = directory
        self.every = every
        self.fingerprint = fingerprint
        self.dataset = dataset
        self.local = local
        self.optimizer = optimizer
        self.iteration = 0
        self.history: list[dict[str, Any]] = []

    def restore(self, resume: RecipeCheckpoint) -> EpochSums:
        """Load ``resume`` into the model, optimizer, dataset and RNG (after the run seeded
        it); returns the sums of the epoch it stopped in (empty at an epoch's end)."""
        resume.check_fingerprint(self.fingerprint, self.directory)
        if resume.sums.iterations != resume.batches_done:
            raise TrainingCheckpointError(
                f"the checkpoint in {self.directory} is damaged: {resume.sums.iterations} "
                f"iterations summed, {resume.batches_done} batches done"
            )
        load_trainable_state(self.local, resume.model)
        optimizer_from_parts(self.optimizer, resume.optimizer, resume.optimizer_tensors)
        try:
            self.dataset.load_state_dict(resume.dataset)
        except ConfigurationError as exc:
            raise TrainingCheckpointError(
                f"the checkpoint in {self.directory} does not fit this dataset: {exc}"
            ) from exc
        if resume.rng is not None:
            torch.set_rng_state(resume.rng)
        self.iteration = resume.iteration
        self.history = list(resume.history)
        return resume.sums

    def after_iteration(self, epoch: int, so_far: Callable[[], EpochSums], *, last: bool) -> None:
        """Count one iteration; write a checkpoint when it is the ``every``-th, unless it was
        the epoch's ``last`` (its end writes one)."""
        self.iteration += 1
        if self.every and self.iteration % self.every == 0 and not last:
            self._save(epoch, so_far())

    def epoch_end(self, epoch: int, history: list[dict[str, Any]]) -> None:
        """Write the checkpoint of epoch ``epoch``'s end: the next one starts at its beginning."""
        self.history = history
        self.dataset.set_epoch(epoch + 1)
        self._save(epoch + 1, EpochSums())

    def _save(self, epoch: int, sums: EpochSums) -> None:
        optimizer, optimizer_tensors = optimizer_to_parts(self.optimizer)
        checkpoint = RecipeCheckpoint(
            fingerprint=self.fingerprint,
            epoch=epoch,
            iteration=self.iteration,
            dataset=self.dataset.state_dict(),
            sums=sums,
            history=self.history,
            optimizer=optimizer,
            model=trainable_state(self.local),
            optimizer_tensors=optimizer_tensors,
            rng=torch.get_rng_state(),
        )
        save_recipe_checkpoint(self.directory, checkpoint)
        log.info(
            "checkpoint: epoch %d, %d batches into it (iteration %d) in %s",
            epoch + 1,
            checkpoint.batches_done,
            self.iteration,
            self.directory,
        )
