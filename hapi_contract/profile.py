"""Conversion between a model profile (``hapi_models.profiling.ModelProfile``) and ``ProfileSpec``.

The contract must not import the model zoo at import time, so the profile is read by duck typing:
anything with ``.layers`` (items with ``output_bytes_per_sample`` and
``activation_bytes_per_sample``), ``.weight_bytes`` and ``.input_shape`` converts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import ValidationError

from .errors import ProfileConversionError
from .requests import OutputDtype, ProfileSpec

__all__ = [
    "LayerProfileLike",
    "ModelProfileLike",
    "output_bytes",
    "profile_to_spec",
    "wire_itemsize",
]

_WIRE_ITEMSIZE = {OutputDtype.FLOAT32: 4, OutputDtype.FLOAT16: 2, OutputDtype.BFLOAT16: 2}


class LayerProfileLike(Protocol):
    """What ``profile_to_spec`` reads from one layer of a profile."""

    @property
    def output_bytes_per_sample(self) -> int: ...

    @property
    def activation_bytes_per_sample(self) -> int: ...


class ModelProfileLike(Protocol):
    """What ``profile_to_spec`` reads from a model profile."""

    @property
    def layers(self) -> Sequence[LayerProfileLike]: ...

    @property
    def weight_bytes(self) -> int: ...

    @property
    def input_shape(self) -> Sequence[int]: ...


def profile_to_spec(profile: ModelProfileLike) -> ProfileSpec:
    """Build the ``ProfileSpec`` a request carries from a measured model profile.

    ``input_shape`` may be per sample ``(C, H, W)`` or include the profiling batch of 1
    ``(1, C, H, W)``. Raises :class:`ProfileConversionError` naming what is missing or invalid.
    """
    try:
        layers = list(profile.layers)
        output = [int(layer.output_bytes_per_sample) for layer in layers]
        activation = [int(layer.activation_bytes_per_sample) for layer in layers]
        shape = tuple(int(d) for d in profile.input_shape)
        weight_bytes = int(profile.weight_bytes)
    except (AttributeError, TypeError, ValueError) as exc:
        raise ProfileConversionError(
            f"{type(profile).__name__} is not a model profile: {exc}"
        ) from exc
    if len(shape) == 4 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) != 3:
        raise ProfileConversionError(f"input_shape must be (C, H, W), got {shape}")
    try:
        return ProfileSpec(
            input_shape=shape,  # type: ignore[arg-type]  # length checked above
            output_bytes_per_sample=output,
            activation_bytes_per_sample=activation,
            weight_bytes=weight_bytes,
        )
    except ValidationError as exc:
        raise ProfileConversionError(f"profile does not make a valid ProfileSpec: {exc}") from exc


def wire_itemsize(dtype: OutputDtype | str) -> int:
    """Bytes of one element on the wire at ``dtype``."""
    return _WIRE_ITEMSIZE[OutputDtype(dtype)]


def output_bytes(spec: ProfileSpec, split_index: int, dtype: OutputDtype) -> int:
    """Bytes per sample on the wire after ``split_index`` layers, at ``dtype``.

    ``split_index`` 0 means the transformed input itself. The profile is float32, so 16-bit
    dtypes halve it.
    """
    if not 0 <= split_index <= spec.num_layers:
        raise ValueError(f"split_index {split_index} outside 0..{spec.num_layers}")
    if split_index == 0:
        c, h, w = spec.input_shape
        float32_bytes = c * h * w * 4
    else:
        float32_bytes = spec.output_bytes_per_sample[split_index - 1]
    return float32_bytes * wire_itemsize(dtype) // 4
