"""What every way of training through HAPI sets up first: the model, its transform and freeze.

One place for it, so that the feature dataset, the :func:`~hapi_client.finetune.run_finetune`
recipe and the multi-worker trainer resolve the stored model, rescale the input transform,
check the freeze index, size the classifier and profile the model the same way (and then plan
the split the same way: :func:`hapi_client.planning.plan_split`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import hapi_models

from hapi_contract import DatasetManifest, ProfileSpec, profile_to_spec

from .errors import ConfigurationError
from .model_store import StoredModel, download_model, random_weights_note, resolve_model

if TYPE_CHECKING:
    from .client import HapiClient

__all__ = ["PreparedModel", "cos_batch_cap", "prepare_model", "rescale_transform"]

log = logging.getLogger(__name__)
status = logging.getLogger("hapi_client.status")


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


def cos_batch_cap(manifest: DatasetManifest, b_max: int | None, batch_size: int) -> int:
    """The largest COS batch the server may use: the request's, else the training batch, one
    shard and 1000 at most.

    The thesis has the client set ``b_max``, typically to its training batch (§5.4.5, the
    batch adaptation of eq. (5.1)): the server sends a frame per COS batch, so a COS batch of
    a whole 600-image part sent its first byte when the part was done (the server's and the
    wire's stages in a row, where the split rule predicts them overlapped), and held the
    memory of 600 samples' activations for no faster forward on a CPU."""
    if b_max is not None:
        if b_max < 1:
            raise ConfigurationError(f"b_max must be >= 1, got {b_max}")
        return b_max
    return max(1, min(manifest.shard_size, 1000, batch_size))


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
    began = time.perf_counter()
    stored = resolve_model(client.swift, model)
    manifest = client.manifest(container)
    classes = num_classes or len(manifest.classes)
    net = download_model(client.swift, stored)
    status.info(
        "model %s: %.1f MB of weights read and checked in %.2f s",
        stored.name,
        stored.nbytes / 1e6,
        time.perf_counter() - began,
    )
    if stored.random_seed is not None:
        status.warning(
            "model %s: %s", stored.name, random_weights_note(stored.arch, stored.random_seed)
        )
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
    log.debug("%s: profiled in %.1f ms", stored.arch, seconds * 1e3)
    return PreparedModel(
        stored, manifest, net, transform, freeze, classes, prof, profile_to_spec(prof), seconds
    )
