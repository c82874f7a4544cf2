"""Fine-tuning from Swift in three modes with one API: ``hapi``, ``baseline``, ``all_in_cos``.

* ``hapi``: the HAPI server runs layers ``[0, split)`` next to Swift and streams features; the
  client runs the frozen layers ``[split, freeze)`` and trains ``[freeze, n)``.
* ``baseline``: the client downloads the raw shards (the same bytes) and runs every layer,
  pipelined: the next shards download and decode while the current one computes.
* ``all_in_cos``: the server fine-tunes too (``POST /v1/finetune``) and returns the weights.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import hapi_models
import torch

from hapi_contract import FinetuneRequest, OptimizerSpec, ShardSource, TransformSpec

from .defaults import MODES, Mode
from .errors import ConfigurationError
from .feature_dataset import FeatureDataset, LocalModel
from .metrics import EpochSummary
from .model_store import StoredModel
from .options import ExtractOptions, TrainOptions
from .planning import SplitDecision
from .preflight import preflight as run_preflight
from .preparation import PreparedModel, prepare_model
from .progress import Progress, progress_bar
from .recipe_checkpoint import (
    EpochSums,
    RecipeCheckpoint,
    RecipeCheckpointer,
    load_recipe_checkpoint,
    recipe_fingerprint,
)

if TYPE_CHECKING:
    from .client import HapiClient

log = logging.getLogger(__name__)
status = logging.getLogger("hapi_client.status")


@dataclass(kw_only=True)
class EpochMetrics(EpochSummary):
    """One epoch of the single-process recipe: the common summary plus split and rates."""

    mode: str
    split_index: int
    #: Training iterations (batches) of the epoch.
    iterations: int
    bytes_per_iteration: float
    #: The client's bandwidth estimate after the epoch; None before any transfer was timed.
    bandwidth_mbit_s: float | None
    samples_per_s: float
    #: Seconds from the epoch's start to its first batch: filling the pipeline (None: no batch).
    first_batch_s: float | None = None
    #: Seconds from the epoch's start to its last batch; the rest of the epoch is the last
    #: iteration's training, the pipeline's drain (None: no batch).
    last_batch_s: float | None = None
    #: Samples of the epoch checked against a local recomputation (``verify_fraction``).
    verified_samples: int = 0


@dataclass
class FinetuneResult:
    model: hapi_models.SplittableModel
    history: list[EpochMetrics]
    mode: str
    freeze_index: int
    split: SplitDecision | None = None
    profile_seconds: float = 0.0
    split_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "mode": self.mode,
                "freeze_index": self.freeze_index,
                "split_index": self.split.split_index if self.split else None,
                "split_reason": self.split.reason if self.split else None,
                "profile_seconds": self.profile_seconds,
                "history": [asdict(m) for m in self.history],
            },
            indent=2,
        )


def run_finetune(
    client: HapiClient,
    *,
    model: str | StoredModel,
    container: str,
    eval_container: str | None = None,
    mode: Mode = "hapi",
    train: TrainOptions | None = None,
    extract: ExtractOptions | None = None,
    num_classes: int | None = None,
    transform: hapi_models.InputTransform | None = None,
    device: str = "cpu",
    progress: bool = True,
    max_iterations: int | None = None,
    verify_fraction: float = 0.0,
    preflight: bool = True,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
) -> FinetuneResult:
    """The recipe: fine-tune ``model`` on ``container`` with a plain cross-entropy loop.

    Built from the pieces a user's own loop uses (:class:`~hapi_client.FeatureDataset` and its
    :meth:`~hapi_client.FeatureDataset.local_model`), so the same seed gives the same weights.
    ``mode``: ``"hapi"`` (pushdown at ``extract.split``), ``"baseline"`` (raw shards, every
    layer here) or ``"all_in_cos"`` (the server fine-tunes too). ``train``: batch, epochs,
    optimizer and seed (:class:`~hapi_client.TrainOptions`); ``extract``: split, freeze index,
    crop size and how the features travel (:class:`~hapi_client.ExtractOptions`).
    ``eval_container``: held-out accuracy after each epoch. ``max_iterations``: stop each
    epoch early (benchmarks). ``preflight``: first check in seconds that Swift, both
    containers, the model and the server are there (:func:`~hapi_client.preflight.preflight`),
    so that a missing piece is one line naming what to run, before any training. Progress: a
    bar on a terminal, plain lines elsewhere; status lines go to the ``hapi_client.status``
    logger (:mod:`hapi_client.progress`).

    ``checkpoint_dir`` (modes ``hapi`` and ``baseline``): write a checkpoint there at every
    epoch's end and, with ``checkpoint_every``, every that many training iterations
    (:mod:`hapi_client.recipe_checkpoint`); when it already holds one of this run, resume from
    it, each sample still trained once per epoch (``result.extra["resumed_from"]`` says where),
    and a finished run's returns its result without training. Another run's checkpoint, or a
    damaged one, is a :class:`~hapi_client.TrainingCheckpointError`.
    """
    if mode not in MODES:
        raise ConfigurationError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    _check_checkpointing(mode, checkpoint_dir, checkpoint_every)
    train = train or TrainOptions()
    extract = extract or ExtractOptions()
    # Before any work: a damaged checkpoint fails at once.
    resume = load_recipe_checkpoint(checkpoint_dir) if checkpoint_dir else None
    if preflight:
        run_preflight(client, model=model, containers=[container, eval_container], mode=mode)
    prepared = prepare_model(
        client,
        model,
        container,
        num_classes=num_classes,
        freeze_index=extract.freeze_index,
        transform=transform,
        image_size=extract.image_size,
        seed=train.seed,
    )
    if mode == "all_in_cos":
        return _all_in_cos(client, prepared, container, eval_container, train, extract.b_max)
    start = time.perf_counter()
    # The recipe is one process; multi-worker training is hapi_client.distributed's job.
    dataset = FeatureDataset.from_options(
        client,
        container,
        prepared,
        train=train,
        extract=extract,
        mode=mode,
        rank=0,
        world_size=1,
        verify_fraction=verify_fraction,
    )
    split_seconds = time.perf_counter() - start
    log.info(
        "%s: split %d (%s)", prepared.stored.arch, dataset.split_index, dataset.decision.reason
    )
    local = dataset.local_model(device)
    run = _Run(
        client,
        prepared,
        dataset,
        local,
        train.optimizer_config().build(local.trainable_parameters()),
        mode,
        train,
        extract,
        device,
        progress,
        max_iterations,
    )
    torch.manual_seed(train.seed)
    history: list[EpochMetrics] = []
    extra: dict[str, Any] = {}
    pending = EpochSums()  # the sums of a resumed epoch's part before the restart
    first_epoch = 0
    if checkpoint_dir is not None:
        run.saver = _checkpointer(run, container, Path(checkpoint_dir), checkpoint_every)
        if resume is not None:
            pending, history, first_epoch = _resume(run, resume, checkpoint_dir, extra)
    for epoch in range(first_epoch, train.epochs):
        trained = _train_epoch(run, epoch, pending)
        pending = EpochSums()
        eval_acc = _evaluate_epoch(run, eval_container) if eval_container is not None else None
        history.append(_epoch_metrics(run, epoch, trained, eval_acc))
        log.info("epoch %d: %s", epoch + 1, history[-1])
        if run.saver is not None:
            run.saver.epoch_end(epoch, [asdict(m) for m in history])
    return _result(run, history, split_seconds, extra, verify_fraction)


@dataclass
class _Run:
    """What every step of one recipe run (modes hapi and baseline) shares."""

    client: HapiClient
    prepared: PreparedModel
    dataset: FeatureDataset
    local: LocalModel
    opt: torch.optim.Optimizer
    mode: Literal["hapi", "baseline"]
    train: TrainOptions
    extract: ExtractOptions
    device: str
    progress: bool
    max_iterations: int | None
    saver: RecipeCheckpointer | None = None
    #: The evaluation dataset, kept across epochs while the training's split stays.
    held_out: FeatureDataset | None = None


@dataclass
class _TrainedEpoch:
    """An epoch's training: its sums (a resumed epoch's part before the restart included), its
    seconds, when this attempt started and when each of its batches arrived."""

    sums: EpochSums
    seconds: float
    start: float
    arrivals: list[float]


def _checkpointer(
    run: _Run, container: str, directory: Path, every: int | None
) -> RecipeCheckpointer:
    fingerprint = recipe_fingerprint(
        run.prepared, container, mode=run.mode, train=run.train, extract=run.extract
    )
    return RecipeCheckpointer(directory, every, fingerprint, run.dataset, run.local, run.opt)


def _resume(
    run: _Run, resume: RecipeCheckpoint, checkpoint_dir: str | Path, extra: dict[str, Any]
) -> tuple[EpochSums, list[EpochMetrics], int]:
    """Load ``resume`` into the run: the resumed epoch's sums so far, the history, the epoch."""
    assert run.saver is not None
    pending = run.saver.restore(resume)
    extra["resumed_from"] = {
        "epoch": resume.epoch,
        "batches_done": resume.batches_done,
        "iteration": resume.iteration,
    }
    status.info(
        "resuming from the checkpoint in %s: epoch %d, %d batches into it",
        checkpoint_dir,
        resume.epoch + 1,
        resume.batches_done,
    )
    return pending, [EpochMetrics(**m) for m in resume.history], resume.epoch


def _train_epoch(run: _Run, epoch: int, sums: EpochSums) -> _TrainedEpoch:
    """Train one epoch (or its rest, from ``sums`` of a resumed one), checkpointing as set."""
    dataset, saver = run.dataset, run.saver
    dataset.set_epoch(epoch)  # a resumed epoch goes on where its checkpoint stands
    start = time.perf_counter()
    run.local.train()
    bar = progress_bar(
        len(dataset), f"{run.mode} epoch {epoch + 1}/{run.train.epochs}", enabled=run.progress
    )
    bar.update(sums.iterations)
    arrivals: list[float] = []
    limit = len(dataset) if run.max_iterations is None else min(len(dataset), run.max_iterations)
    batches = _with_progress(dataset, bar, start, limit - sums.iterations, arrivals)
    for x, y in batches:
        loss_sum, correct = hapi_models.train_step(run.local, x, y, run.opt, run.device)
        sums.loss_sum += loss_sum
        sums.correct += correct
        sums.samples += len(y)
        sums.iterations += 1
        if saver is not None:
            saver.after_iteration(
                epoch,
                functools.partial(_so_far, sums, dataset, start, arrivals),
                last=sums.iterations >= limit,
            )
    bar.close()
    return _TrainedEpoch(sums, sums.seconds + time.perf_counter() - start, start, arrivals)


def _evaluate_epoch(run: _Run, eval_container: str) -> float:
    """Held-out accuracy at the training's split (its dataset made again when the split moved)."""
    split = run.dataset.split_index
    if run.held_out is None or run.held_out.split_index != split:
        eval_prepared = dataclasses.replace(
            run.prepared, manifest=run.client.manifest(eval_container)
        )
        run.held_out = FeatureDataset.from_options(
            run.client,
            eval_container,
            eval_prepared,
            train=run.train,
            extract=run.extract.replace(split=split),
            mode=run.mode,
            rank=0,
            world_size=1,
            shuffle=False,
            evaluation=True,
        )
    return _evaluate(run.local, run.held_out, run.device)


def _epoch_metrics(
    run: _Run, epoch: int, trained: _TrainedEpoch, eval_acc: float | None
) -> EpochMetrics:
    sums, seconds, start, arrivals = trained.sums, trained.seconds, trained.start, trained.arrivals
    counters = run.dataset.last_counters
    bw = run.client.bandwidth.bytes_per_s
    # Sums of a resumed epoch: the part before the restart plus this attempt's counters.
    wire_bytes = counters.wire_bytes + sums.wire_bytes
    first_batch_s = sums.first_batch_s
    if first_batch_s is None and arrivals:
        first_batch_s = arrivals[0] - start
    return EpochMetrics(
        epoch=epoch + 1,
        mode=run.mode,
        split_index=run.dataset.split_index,
        loss=sums.loss_sum / sums.samples if sums.samples else float("nan"),
        train_accuracy=sums.correct / sums.samples if sums.samples else float("nan"),
        eval_accuracy=eval_acc,
        seconds=seconds,
        samples=sums.samples,
        iterations=sums.iterations,
        bytes_received=wire_bytes,
        bytes_per_iteration=wire_bytes / max(1, sums.iterations),
        requests=counters.requests + sums.requests,
        bandwidth_mbit_s=bw * 8e-6 if bw else None,
        samples_per_s=sums.samples / seconds,
        first_batch_s=first_batch_s,
        last_batch_s=sums.seconds + arrivals[-1] - start if arrivals else None,
        verified_samples=counters.verified_samples + sums.verified_samples,
    )


def _result(
    run: _Run,
    history: list[EpochMetrics],
    split_seconds: float,
    extra: dict[str, Any],
    verify_fraction: float,
) -> FinetuneResult:
    """The trained model and the run's record: cache hits, what verification checked."""
    dataset = run.dataset
    net = run.local.full_model()
    net.eval()
    extra["cache_hits"] = dataset.cache.hits if dataset.cache else 0
    if dataset.verifier is not None:
        extra["verified_shards"] = dataset.verifier.checked_shards
        extra["verified_samples"] = dataset.verifier.checked_samples
        status.info(
            "verification: %d samples of %d shards matched the local computation",
            dataset.verifier.checked_samples,
            dataset.verifier.checked_shards,
        )
        if dataset.verifier.checked_samples == 0:
            log.warning(
                "verify_fraction=%g verified nothing in this run: no shard was drawn",
                verify_fraction,
            )
    decision = dataset.decision
    if run.mode == "baseline":
        decision = SplitDecision(
            0, "baseline: raw shards, every layer on the client", 0.0, 0.0, 0.0, ()
        )
    return FinetuneResult(
        net.cpu(),
        history,
        run.mode,
        run.prepared.freeze_index,
        decision,
        run.prepared.profile_seconds,
        split_seconds,
        extra,
    )


def _check_checkpointing(
    mode: str, checkpoint_dir: str | Path | None, checkpoint_every: int | None
) -> None:
    if checkpoint_every is not None and (
        isinstance(checkpoint_every, bool)
        or not isinstance(checkpoint_every, int)
        or checkpoint_every < 1
    ):
        raise ConfigurationError(
            f"checkpoint_every must be >= 1 iteration, got {checkpoint_every!r}"
        )
    if checkpoint_every is not None and checkpoint_dir is None:
        raise ConfigurationError("checkpoint_every needs checkpoint_dir")
    if checkpoint_dir is not None and mode == "all_in_cos":
        raise ConfigurationError(
            "checkpoint_dir works in modes hapi and baseline; in all_in_cos the server trains"
        )


def _so_far(
    sums: EpochSums, dataset: FeatureDataset, start: float, arrivals: list[float]
) -> EpochSums:
    """The epoch's sums for a mid-epoch checkpoint: ``sums`` (its part before any restart, plus
    this attempt's training) with this attempt's transfer counters and seconds added."""
    counters = dataset.last_counters
    return dataclasses.replace(
        sums,
        wire_bytes=sums.wire_bytes + counters.wire_bytes,
        requests=sums.requests + counters.requests,
        verified_samples=sums.verified_samples + counters.verified_samples,
        seconds=sums.seconds + time.perf_counter() - start,
        first_batch_s=(
            sums.first_batch_s
            if sums.first_batch_s is not None or not arrivals
            else arrivals[0] - start
        ),
    )


def _with_progress(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    bar: Progress,
    start: float,
    max_iterations: int | None,
    arrivals: list[float],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` with the progress bar updated; each batch's arrival time is appended to
    ``arrivals``."""
    seen = 0
    for x, y in batches:
        arrivals.append(time.perf_counter())
        yield x, y
        seen += 1
        bar.update(1)
        bar.set_postfix(sps=f"{seen * len(y) / max(time.perf_counter() - start, 1e-9):.0f}")
        if max_iterations is not None and seen >= max_iterations:
            return


def _evaluate(local: LocalModel, held_out: FeatureDataset, device: str) -> float:
    held_out.set_epoch(0)
    local.eval()
    try:
        return hapi_models.evaluate(local, held_out, device)
    finally:
        local.train()


def _all_in_cos(
    client: HapiClient,
    prepared: PreparedModel,
    container: str,
    eval_container: str | None,
    train: TrainOptions,
    b_max: int | None,
) -> FinetuneResult:
    batch_size = train.batch_size
    stored, net, manifest = prepared.stored, prepared.net, prepared.manifest
    classes, freeze, transform = prepared.num_classes, prepared.freeze_index, prepared.transform
    # Every shard of a manifest lies alike: the first says where (a webdataset's tars lie in
    # the data container, a folder's parts beside the manifest, their images in the data one).
    source = ShardSource.of(manifest, container, 0)
    req = FinetuneRequest(
        container=source.container,
        layout=source.layout,
        data_container=source.data_container,
        label_field=source.label_field,
        shards=[s.name for s in manifest.shards],
        etags={s.name: s.etag for s in manifest.shards},  # read only as the manifest has them
        model=stored.ref(),
        target_classes=classes if classes != stored.num_classes else None,
        freeze_index=freeze,
        transform=TransformSpec.model_validate(transform),  # read by attribute, no mapping
        batch_size=batch_size,
        epochs=train.epochs,
        optimizer=OptimizerSpec.model_validate(train.optimizer_config()),
        seed=train.seed,
        b_max=b_max or batch_size,
    )
    start = time.perf_counter()
    blob, meta = client.transport.finetune(req)
    seconds = time.perf_counter() - start
    hapi_models.load_weights(net, blob)
    eval_acc = None
    if eval_container is not None:
        eval_prepared = dataclasses.replace(prepared, manifest=client.manifest(eval_container))
        held_out = FeatureDataset(
            client,
            eval_container,
            stored,
            batch_size=batch_size,
            mode="baseline",
            prepared=eval_prepared,
            shuffle=False,
            evaluation=True,
        )
        eval_acc = _evaluate(held_out.local_model("cpu"), held_out, "cpu")
    history = []
    epochs_meta = meta.epochs
    iters = math.ceil(manifest.num_samples / batch_size)
    for i, e in enumerate(epochs_meta):
        history.append(
            EpochMetrics(
                epoch=i + 1,
                mode="all_in_cos",
                split_index=net.num_layers,
                loss=e.loss,
                train_accuracy=e.train_accuracy,
                eval_accuracy=eval_acc if i == len(epochs_meta) - 1 else None,
                seconds=e.seconds if len(epochs_meta) > 1 else seconds,
                samples=e.samples,
                iterations=iters,
                bytes_received=len(blob) if i == 0 else 0,
                bytes_per_iteration=(len(blob) if i == 0 else 0) / iters,
                requests=1 if i == 0 else 0,
                bandwidth_mbit_s=None,
                samples_per_s=e.samples / max(e.seconds, 1e-9),
            )
        )
    net.eval()
    decision = SplitDecision(
        net.num_layers, "all_in_cos: the server fine-tunes, only weights travel", 0.0, 0.0, 0.0, ()
    )
    return FinetuneResult(
        net,
        history,
        "all_in_cos",
        freeze,
        decision,
        prepared.profile_seconds,
        extra={"server": meta.model_dump(mode="json"), "wall_seconds": seconds},
    )
