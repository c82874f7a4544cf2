"""What every way of training through HAPI sets up first: the model, its transform, freeze and split.

One place for it, so that the feature dataset, the :func:`~hapi_client.finetune.run_finetune`
recipe and the multi-worker trainer resolve the stored model, rescale the input transform,
check the freeze index, size the classifier, profile the model and choose the split the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import hapi_models
import torch

from hapi_contract import (
    Compression,
    DatasetManifest,
    OutputDtype,
    ProfileSpec,
    profile_to_spec,
    wire_itemsize,
)

from .costs import PipelineCosts, measure_pipeline_costs
from .errors import ConfigurationError
from .model_store import StoredModel, download_model, resolve_model
from .split import SplitDecision, choose_split_index
from .split_time import choose_split_by_time

if TYPE_CHECKING:
    from .client import HapiClient

__all__ = [
    "PreparedModel",
    "SPLIT_RULES",
    "SplitChoice",
    "cos_batch_cap",
    "decide_split",
    "prepare_model",
    "rescale_transform",
    "split_costs",
]

log = logging.getLogger(__name__)

#: ``"auto"`` (predicted time per iteration, :mod:`hapi_client.split_time`), ``"thesis"``
#: (thesis Algorithm 2 on the measured bandwidth), ``"freeze"`` (the freeze index) or an index.
SplitChoice = int | Literal["auto", "thesis", "freeze"]
SPLIT_RULES = ("auto", "thesis", "freeze")


@dataclass
class PreparedModel:
    """A stored model made ready to train on one dataset container."""

    stored: StoredModel
    manifest: DatasetManifest
    net: hapi_models.SplittableModel
    """The whole model, classifier sized to the dataset, on the CPU, not yet frozen."""
    transform: hapi_models.InputTransform
    freeze_index: int
    num_classes: int
    profile: hapi_models.ModelProfile
    profile_spec: ProfileSpec
    profile_seconds: float


def rescale_transform(
    transform: hapi_models.InputTransform, image_size: int | None
) -> hapi_models.InputTransform:
    """The transform at another crop size, keeping its resize/crop ratio and normalisation."""
    if image_size is None:
        return transform
    if image_size < 1:
        raise ConfigurationError(f"image_size must be >= 1, got {image_size}")
    resize = round(image_size * transform.resize / transform.crop)
    return dataclasses.replace(transform, resize=resize, crop=image_size)


def cos_batch_cap(manifest: DatasetManifest, b_max: int | None) -> int:
    """The largest COS batch the server may use: the request's, else one shard (at most 1000)."""
    if b_max is not None:
        if b_max < 1:
            raise ConfigurationError(f"b_max must be >= 1, got {b_max}")
        return b_max
    return max(1, min(manifest.shard_size, 1000))


def prepare_model(
    client: HapiClient,
    model: str | StoredModel,
    container: str,
    *,
    num_classes: int | None = None,
    freeze_index: int | None = None,
    transform: hapi_models.InputTransform | None = None,
    image_size: int | None = None,
    seed: int = 0,
) -> PreparedModel:
    """Resolve and download ``model``, and fit it to the dataset in ``container``.

    The classifier gets the dataset's class count (or ``num_classes``), initialised from
    ``seed`` so that every process that prepares the same run builds the same head.
    """
    stored = resolve_model(client.swift, model)
    manifest = client.manifest(container)
    classes = num_classes or len(manifest.classes)
    net = download_model(client.swift, stored)
    transform = rescale_transform(transform or net.transform, image_size)
    freeze = net.default_freeze_index if freeze_index is None else freeze_index
    if isinstance(freeze, bool) or not isinstance(freeze, int) or not 0 <= freeze < net.num_layers:
        raise ConfigurationError(
            f"freeze index {freeze!r} out of range [0, {net.num_layers - 1}] for {stored.arch}"
        )
    if classes != stored.num_classes:
        net.replace_classifier(classes, seed=seed)
    start = time.perf_counter()
    prof = hapi_models.profile(net, transform.input_shape)
    seconds = time.perf_counter() - start
    log.info("%s: profiled in %.1f ms", stored.arch, seconds * 1e3)
    return PreparedModel(
        stored, manifest, net, transform, freeze, classes, prof, profile_to_spec(prof), seconds
    )


def decide_split(
    prof: hapi_models.ModelProfile,
    manifest: DatasetManifest,
    batch_size: int,
    bandwidth: float | None,
    freeze: int,
    output_dtype: OutputDtype,
    split: SplitChoice | str,
    costs: PipelineCosts | None = None,
) -> SplitDecision:
    """The split for ``split`` = ``"auto"`` (the fastest predicted from ``costs`` and
    ``bandwidth``; Algorithm 2 when the server's costs are missing), ``"thesis"`` (Algorithm 2
    on ``bandwidth``), ``"freeze"`` or an index in ``[0, freeze]``."""
    if split == "freeze":
        return SplitDecision(freeze, "forced to the freeze index", 0.0, 0.0, 0.0, (), "forced")
    if isinstance(split, int) and not isinstance(split, bool):
        if not 0 <= split <= freeze:
            raise ConfigurationError(f"split index {split} must be in [0, freeze index {freeze}]")
        return SplitDecision(split, "forced by the caller", 0.0, 0.0, 0.0, (), "forced")
    if split not in ("auto", "thesis"):
        raise ConfigurationError(
            f"split must be 'auto', 'thesis', 'freeze' or an index, got {split!r}"
        )
    if bandwidth is None:
        raise ConfigurationError(f"split={split!r} needs a bandwidth estimate (probe Swift first)")
    if split == "auto" and costs is not None and costs.server is not None:
        return choose_split_by_time(
            costs.server,
            costs.client,
            manifest.mean_shard_bytes_per_sample,
            batch_size,
            bandwidth,
            freeze,
        )
    decision = choose_split_index(
        prof,
        manifest.mean_shard_bytes_per_sample,
        batch_size,
        bandwidth,
        freeze,
        wire_bytes_per_element=wire_itemsize(output_dtype),
    )
    if split == "auto":
        why = costs.server_missing if costs is not None else "no measured costs"
        decision = dataclasses.replace(decision, reason=f"{why}; Algorithm 2: {decision.reason}")
    return decision


def split_costs(
    client: HapiClient,
    prepared: PreparedModel,
    container: str,
    *,
    output_dtype: OutputDtype,
    compression: Compression,
    b_max: int,
    device: torch.device | None = None,
) -> PipelineCosts:
    """What ``split="auto"`` needs measured: the costs of every split (and, on the way, the
    bandwidth, when it is not known yet). ``device``: where training runs (default: CUDA when
    there is one)."""
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return measure_pipeline_costs(
        client,
        prepared,
        container,
        output_dtype=output_dtype,
        compression=compression,
        device=device,
        b_max=b_max,
    )
