"""Models in Swift: a safetensors object plus a small JSON descriptor (arch, classes, sha256)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import hapi_models
import torch
from swiftclient.client import Connection

from hapi_contract import ModelRef, WeightsRef

from .datasets import put_object_idempotent, put_object_if_changed
from .errors import ConfigurationError, SwiftAccessError
from .swift_session import SwiftSession

log = logging.getLogger(__name__)

DEFAULT_MODELS_CONTAINER = "models"


@dataclass(frozen=True)
class StoredModel:
    arch: str
    num_classes: int
    container: str
    object: str
    sha256: str
    nbytes: int = 0
    #: The seed of a random initialisation (no pretrained weights were given), else None; a
    #: descriptor from before this field says None. Written only when set, so descriptors of
    #: trained weights keep their bytes.
    random_seed: int | None = None

    def ref(self) -> ModelRef:
        return ModelRef(
            arch=self.arch,
            num_classes=self.num_classes,
            weights=WeightsRef(container=self.container, object=self.object, sha256=self.sha256),
        )

    @property
    def name(self) -> str:
        return f"{self.container}/{self.object.removesuffix('.safetensors')}"


#: ``weights=`` values that name a source rather than a file.
TORCHVISION_WEIGHTS = "torchvision"
PACKAGED_WEIGHTS = "imagenet"


def is_random_init(arch: str, weights: str | Path | None) -> bool:
    """Whether :func:`pretrained_model` gives ``arch`` a random initialisation for ``weights``."""
    return weights is None and not hapi_models.get_spec(arch).has_pretrained


def random_weights_note(arch: str, seed: int) -> str:
    """What a user must be told about a randomly initialised ``arch``, and how to do better."""
    if arch.startswith("timm/"):
        how = (
            "--weights FILE with timm's pretrained weights (e.g. the state_dict of "
            f"timm.create_model({arch.removeprefix('timm/')!r}, pretrained=True), saved "
            "with safetensors)"
        )
    else:
        how = (
            "--weights torchvision (torchvision's ImageNet weights, from torch's hub cache or "
            "downloaded) or --weights FILE (a checkpoint of your own)"
        )
    return (
        f"random weights (seed {seed}): {arch} has no packaged weights and none were given, so "
        "its frozen layers give random features and fine-tuning learns little; for pretrained "
        f"weights upload it again with {how}"
    )


def pretrained_model(
    arch: str,
    weights: str | Path | None = None,
    *,
    num_classes: int | None = None,
    seed: int = 0,
) -> hapi_models.SplittableModel:
    """The model a user means by ``weights``; every key and shape checked.

    - ``None``: the packaged ImageNet weights where the architecture has them
      (efficientnet_lite0), else a random initialisation from ``seed``;
    - ``"imagenet"``: the packaged ImageNet weights (an error where there are none);
    - ``"torchvision"``: torchvision's default weights for ``arch`` (torch's hub cache, else a
      download; offline, the error names the file and where to put it);
    - a path: a checkpoint of the native network or of HAPI's layer list, as ``.safetensors``
      or a torch file read with ``weights_only=True`` (never a plain unpickle).

    ``num_classes`` sets the classifier of a random initialisation; with weights it must agree
    with theirs.
    """
    spec = hapi_models.get_spec(arch)
    if weights is None and not spec.has_pretrained:
        torch.manual_seed(seed)
        return hapi_models.get_model(arch, num_classes=num_classes or 1000)
    if weights is None or weights == PACKAGED_WEIGHTS:
        if num_classes not in (None, 1000):
            raise ConfigurationError(
                f"{arch}'s packaged ImageNet weights have 1000 classes, not {num_classes}; leave "
                "num_classes out (fine-tuning gives the model a classifier for the dataset)"
            )
        return hapi_models.get_model(arch, num_classes=1000, weights=PACKAGED_WEIGHTS)
    if weights == TORCHVISION_WEIGHTS:
        state = hapi_models.torchvision_weights(arch)
    else:
        state = hapi_models.read_checkpoint(weights)
    return hapi_models.import_weights(arch, state, num_classes=num_classes)


def upload_model(
    conn: Connection,
    arch: str,
    *,
    container: str = DEFAULT_MODELS_CONTAINER,
    weights: str | Path | None = None,
    num_classes: int | None = None,
    seed: int = 0,
) -> tuple[StoredModel, bool]:
    """Store a model's weights (safetensors) and descriptor; return it and whether bytes moved.

    ``weights`` as in :func:`pretrained_model`: the stored object is always safetensors with
    its sha256, whatever the source's format.
    """
    model = pretrained_model(arch, weights, num_classes=num_classes, seed=seed)
    classes = model.num_classes
    blob = hapi_models.weights_to_bytes(model)
    sha = hapi_models.sha256_hex(blob)
    obj = f"{arch}.safetensors"
    conn.put_container(container)
    result = put_object_if_changed(conn, container, obj, blob, "application/octet-stream")
    random_seed = seed if is_random_init(arch, weights) else None
    stored = StoredModel(arch, classes, container, obj, sha, len(blob), random_seed)
    descriptor = {k: v for k, v in asdict(stored).items() if k != "random_seed" or v is not None}
    put_object_idempotent(
        conn,
        container,
        f"{arch}.json",
        json.dumps(descriptor, indent=2).encode(),
        "application/json",
    )
    uploaded = result.uploaded
    if random_seed is not None:
        log.warning("model %s: %s", stored.name, random_weights_note(arch, random_seed))
    log.info(
        "model %s: %d bytes, sha256 %s (%s)",
        stored.name,
        len(blob),
        sha,
        "uploaded" if uploaded else "unchanged",
    )
    return stored, uploaded


def resolve_model(swift: SwiftSession, ref: str | StoredModel) -> StoredModel:
    """``container/arch`` (a descriptor written by :func:`upload_model`) or a StoredModel."""
    if isinstance(ref, StoredModel):
        return ref
    container, _, name = ref.partition("/")
    if not container or not name:
        raise ConfigurationError(
            f"model reference {ref!r} must look like 'models/efficientnet_lite0'"
        )
    data, _ = swift.get(container, f"{name}.json", observe=False)
    try:
        return StoredModel(**json.loads(data))
    except (TypeError, ValueError) as exc:
        raise SwiftAccessError(f"{container}/{name}.json is not a model descriptor: {exc}") from exc


def download_model(swift: SwiftSession, stored: StoredModel) -> hapi_models.SplittableModel:
    blob, _ = swift.get(stored.container, stored.object, observe=False)
    return hapi_models.get_model(
        stored.arch, num_classes=stored.num_classes, weights=blob, sha256=stored.sha256
    )
