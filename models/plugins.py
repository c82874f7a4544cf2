"""Architectures an operator installs: the ``hapi.models`` entry-point group.

A HAPI server or Swift filter runs only code installed on it: a client names an architecture,
it never sends code. An installed distribution adds architectures with entry points::

    [project.entry-points."hapi.models"]
    tinynet = "hapi_tinynet:build"

The entry point's name is the architecture's name (``[a-z0-9_]``, at most 64 characters, not
one the registry has). Its object is either a :class:`~hapi_models.ModelSpec` (a network cut by
hand) or a callable ``build(num_classes) -> nn.Module``, cut at its graph's split points
(:mod:`.graph_split`); the callable may carry ``hapi_transform`` (an
:class:`~hapi_models.InputTransform`; ImageNet's by default) and ``hapi_description``.

A plugin that fails does not take the registry down with it: its name is remembered with the
cause, and asking for it raises :class:`~hapi_models.PluginError` (a 4xx from the server).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from importlib import metadata

from torch import nn

from .errors import PluginError
from .registry import ModelSpec, is_registered, mark_broken, register
from .transforms import InputTransform
from .zoo.graph_families import NetFactory, graph_spec

log = logging.getLogger(__name__)

__all__ = ["GROUP", "register_plugins"]

GROUP = "hapi.models"
_NAME = re.compile(r"[a-z0-9_]{1,64}")


def register_plugins() -> None:
    """Register the architecture of every ``hapi.models`` entry point installed."""
    for entry in metadata.entry_points(group=GROUP):
        origin = f"plugin {entry.name!r} ({entry.value}, from {_distribution(entry)})"
        if not _NAME.fullmatch(entry.name):
            log.error("%s ignored: names are 1-64 characters of [a-z0-9_]", origin)
            continue
        if is_registered(entry.name):
            log.error("%s ignored: the registry has an architecture of that name", origin)
            continue
        try:
            spec = _spec_of(entry, origin)
        except PluginError as exc:
            log.error("%s", exc)
            mark_broken(entry.name, exc)
            continue
        register(spec)


def _spec_of(entry: metadata.EntryPoint, origin: str) -> ModelSpec:
    try:
        obj = entry.load()
    except Exception as exc:  # noqa: BLE001 - whatever a plugin raises, the registry survives it
        raise PluginError(f"{origin} raises on import: {type(exc).__name__}: {exc}") from exc
    family = f"plugin:{_distribution(entry)}"
    if isinstance(obj, ModelSpec):
        if obj.name != entry.name:
            raise PluginError(f"{origin} holds a spec named {obj.name!r}, not {entry.name!r}")
        return dataclasses.replace(obj, family=family)
    if not callable(obj):
        raise PluginError(
            f"{origin} is a {type(obj).__name__}, neither a ModelSpec nor a builder function"
        )
    transform = getattr(obj, "hapi_transform", InputTransform())
    if not isinstance(transform, InputTransform):
        raise PluginError(f"{origin}: hapi_transform is not an InputTransform")
    description = str(getattr(obj, "hapi_description", f"{entry.name}, from {family}"))
    return graph_spec(
        entry.name, _checked(obj, origin), transform, family=family, description=description
    )


def _checked(build: NetFactory, origin: str) -> NetFactory:
    def factory(num_classes: int) -> nn.Module:
        try:
            net = build(num_classes)
        except Exception as exc:  # noqa: BLE001 - named as the plugin's failure, not the server's
            raise PluginError(f"{origin}: its builder raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(net, nn.Module):
            raise PluginError(
                f"{origin}: its builder returned a {type(net).__name__}, not an nn.Module"
            )
        return net

    return factory


def _distribution(entry: metadata.EntryPoint) -> str:
    dist = entry.dist
    return dist.name if dist is not None else "an unknown distribution"
