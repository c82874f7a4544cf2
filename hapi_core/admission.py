"""Model admission: what a request may run, checked the same way by every host.

Whether a request may run a model (:func:`admit_model`), its weights' size before a byte is
read (:func:`check_weights`), the weights' sha256 and load (:func:`build_model`), the caller's
token (:func:`check_token`) and the input transform of a request (:func:`input_transform`).
The HAPI server and the Swift filter's in-proxy execution both admit through these functions,
so the same bad input gets the same status and code; how they answer is :mod:`.answers`'.
"""

from __future__ import annotations

from typing import ParamSpec, TypeVar

import hapi_models
import torch

from hapi_contract import (
    ModelRef,
    TransformSpec,
)

from .errors import (
    ChecksumError,
    InvalidRequestError,
    UnauthorizedError,
)
from .estimates import model_footprint
from .inputs import check_weights_size

P = ParamSpec("P")
T = TypeVar("T")

__all__ = [
    "admit_model",
    "build_model",
    "check_token",
    "check_weights",
    "input_transform",
]


def check_token(token: str | None) -> str:
    """401 without the caller's Swift token: every read is the caller's own, and a request
    without a token is refused in both executions, even for a public (``.r:*``) container."""
    if not token:
        raise UnauthorizedError("missing X-Auth-Token: send the Swift token of the caller")
    return token


def input_transform(spec: TransformSpec) -> hapi_models.InputTransform:
    """The transform a request's ``transform`` describes (``grayscale_to_rgb`` is always on)."""
    return hapi_models.InputTransform(**spec.model_dump(include={"resize", "crop", "mean", "std"}))


def admit_model(
    ref: ModelRef, split: int | None = None, what: str = "split_index"
) -> hapi_models.ModelSpec:
    """The architecture's spec, if the request may run it: a known architecture, ``split``
    within its layers, and weights named (422 otherwise)."""
    try:
        spec = hapi_models.get_spec(ref.arch)
        num_layers = spec.num_layers  # a network cut at its graph's split points is traced here
    except hapi_models.HapiModelError as exc:  # unknown, untraceable, or a plugin that fails
        raise InvalidRequestError(str(exc)) from exc
    if split is not None and not 0 <= split <= num_layers:
        raise InvalidRequestError(
            f"{what} {split} out of range for {ref.arch}: must be in [0, {num_layers}]"
        )
    if ref.weights is None:
        raise InvalidRequestError(
            "model.weights is required: store the weights in Swift (`hapi upload model`) and name "
            "them with their sha256, so the server and the client run the same network"
        )
    return spec


def _weights_name(ref: ModelRef) -> str:
    assert ref.weights is not None  # admit_model ran first
    return f"weights {ref.weights.container}/{ref.weights.object}"


def check_weights(ref: ModelRef, size: int | None, max_bytes: int) -> None:
    """Refuse the weights by size alone (``size`` None: the model's own size only), before a
    byte is read or a model built: 413 over ``max_bytes``, 422 for another model's weights."""
    fp = model_footprint(ref.arch, ref.num_classes)
    check_weights_size(
        size,
        state_bytes=fp.state_bytes,
        state_key_bytes=fp.state_key_bytes,
        num_tensors=fp.num_tensors,
        max_bytes=max_bytes,
        what=_weights_name(ref),
        model=f"{ref.arch} with {ref.num_classes} classes",
    )


def build_model(
    ref: ModelRef, blob: bytes | bytearray, device: torch.device
) -> hapi_models.SplittableModel:
    """The model of ``blob`` on ``device`` in eval mode, once its sha256 is the one the request
    names (409 otherwise) and it loads as the architecture's weights (422 otherwise)."""
    assert ref.weights is not None
    digest = hapi_models.sha256_hex(blob)
    if digest != ref.weights.sha256:
        raise ChecksumError(
            f"{_weights_name(ref)} have sha256 {digest}, the request names {ref.weights.sha256}"
        )
    try:
        model = hapi_models.get_model(ref.arch, num_classes=ref.num_classes, weights=blob)
    except hapi_models.WeightsError as exc:
        raise InvalidRequestError(f"{_weights_name(ref)}: {exc}") from exc
    return model.to(device).eval()
