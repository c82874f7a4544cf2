"""What ``GET /v1/models`` and ``hapi models`` list: each architecture's split points and shapes.

Describing an architecture traces its graph on the meta device (nothing is allocated or
computed, but tracing every listed network takes about 25 s on a 2-core CPU), so each
description is kept in this process and on disk (:mod:`.listing_cache`); a fresh process that
finds them lists every network in seconds. One architecture that cannot be described (an
operator's plugin that torch.fx cannot trace, or whose import fails) is reported with its
cause, never hiding the others.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from . import listing_cache
from .errors import HapiModelError
from .registry import broken_plugins, get_model, get_spec, list_models
from .split_points import SplitPoint
from .transforms import InputTransform

log = logging.getLogger(__name__)

__all__ = ["Listing", "ModelListing", "describe_model", "describe_models"]


@dataclass(frozen=True)
class ModelListing:
    """One architecture as listed: its split points' names and one sample's shape at each.

    ``sample_shapes[0]`` is the decoded image's, ``sample_shapes[i]`` layer ``i - 1``'s output.
    """

    name: str
    family: str
    transform: InputTransform
    layer_names: tuple[str, ...]
    default_freeze_index: int
    sample_shapes: tuple[tuple[int, ...], ...]

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    def split_points(self) -> list[SplitPoint]:
        """As :func:`~hapi_models.split_points` gives them."""
        names = ("input", *self.layer_names)
        return [
            SplitPoint(index, name, shape)
            for index, (name, shape) in enumerate(zip(names, self.sample_shapes, strict=True))
        ]


@dataclass(frozen=True)
class Listing:
    """Every listed architecture that could be described, and the cause for each that could not."""

    models: tuple[ModelListing, ...]
    failed: Mapping[str, str]


_memo: dict[str, ModelListing | HapiModelError] = {}
_lock = threading.Lock()


def describe_model(name: str) -> ModelListing:
    """Architecture ``name`` as listed (``timm/NAME`` too), from the cache when it has it.

    Raises:
        UnknownModelError, UntraceableModelError, PluginError: as building the model raises them.
    """
    spec = get_spec(name)
    with _lock:  # one trace per architecture, however many listings ask at once
        known = _memo.get(name)
        if known is None:
            try:
                known = _cached(name, spec.family, spec.transform)
            except HapiModelError as exc:
                log.warning("architecture %s cannot be listed: %s", name, exc)
                known = exc
            _memo[name] = known
    if isinstance(known, HapiModelError):
        raise known
    return known


def describe_models() -> Listing:
    """Every listed architecture (:func:`~hapi_models.list_models`), and the plugins that failed."""
    names = list_models()
    described: dict[str, ModelListing] = {}
    failed = dict(broken_plugins())
    for name in _from_anywhere(names):
        try:
            described[name] = describe_model(name)
        except HapiModelError as exc:
            failed[name] = str(exc)
    models = tuple(described[name] for name in names if name in described)
    return Listing(models, dict(sorted(failed.items())))


def _from_anywhere(names: list[str]) -> list[str]:
    """``names`` from a random one on, round to the one before it.

    Processes that list at once against one cache directory (several servers starting on a
    host, the test suite's servers and CLI) then trace mostly different networks and read each
    other's entries as they come round to them, instead of each tracing all of them in the
    same order. One process alone traces each once either way; the listing keeps its order.
    """
    if not names:
        return names
    start = random.randrange(len(names))  # noqa: S311 - an order, not a secret
    return names[start:] + names[:start]


def _cached(name: str, family: str, transform: InputTransform) -> ModelListing:
    key = listing_cache.entry_key(name, family)
    stored = listing_cache.read_entry(key)
    if stored is not None:
        try:
            return _from_json(name, family, transform, stored)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("model listing cache entry of %s ignored and rebuilt: %s", name, exc)
    listed = _traced(name, family, transform)
    listing_cache.write_entry(key, _to_json(listed))
    return listed


def _traced(name: str, family: str, transform: InputTransform) -> ModelListing:
    spec = get_spec(name)
    traced = spec.traced_sample_shapes
    if traced is not None:
        # Cutting the graph propagated the shapes already: nothing to build or run.
        return ModelListing(
            name,
            family,
            transform,
            spec.layer_names,
            spec.default_freeze_index,
            (transform.input_shape, *traced),
        )
    with torch.device("meta"):  # shapes only
        model = get_model(name, num_classes=1000)
        x = torch.empty((1, *transform.input_shape))
    shapes = [tuple(x.shape[1:])]
    with torch.no_grad():
        for layer in model.layers:
            x = layer(x)
            shapes.append(tuple(x.shape[1:]))
    return ModelListing(
        name,
        family,
        transform,
        tuple(model.layer_names),
        model.default_freeze_index,
        tuple(shapes),
    )


def _to_json(listed: ModelListing) -> dict[str, Any]:
    return {
        "layer_names": list(listed.layer_names),
        "default_freeze_index": listed.default_freeze_index,
        "sample_shapes": [list(shape) for shape in listed.sample_shapes],
    }


def _from_json(
    name: str, family: str, transform: InputTransform, stored: Mapping[str, Any]
) -> ModelListing:
    names = stored["layer_names"]
    freeze = stored["default_freeze_index"]
    shapes = stored["sample_shapes"]
    if not (
        isinstance(names, list)
        and all(isinstance(n, str) for n in names)
        and type(freeze) is int
        and 0 <= freeze <= len(names)
        and isinstance(shapes, list)
        and len(shapes) == len(names) + 1
        and all(isinstance(s, list) and all(type(d) is int for d in s) for s in shapes)
    ):
        raise ValueError("not a listing of split points")
    return ModelListing(
        name, family, transform, tuple(names), freeze, tuple(tuple(s) for s in shapes)
    )
