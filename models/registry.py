"""The model registry: architecture name -> builder of a :class:`SplittableModel`.

Three sources fill it. The thesis' seven networks are cut by hand (:mod:`.zoo`, Table 5.2) and
registered on import. Every other torchvision classification network, every timm network
(named ``timm/<name>``) and every architecture an operator installs through the ``hapi.models``
entry-point group (:mod:`.plugins`) is cut at the split points of its graph
(:mod:`.graph_split`) and registered the first time a name is asked for: discovering them
imports torchvision, timm or the plugin, which ``import hapi_models`` must not pay.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from .errors import PluginError, UnknownModelError
from .splittable import SplittableModel
from .transforms import InputTransform

log = logging.getLogger(__name__)

Builder = Callable[[int, bool], SplittableModel]
"""``builder(num_classes, pretrained) -> SplittableModel``."""


class SplitLayout(NamedTuple):
    """An architecture's split points: one name per layer and the default freeze index.

    ``sample_shapes``: one sample's output shape per layer at the architecture's input size,
    when cutting the graph computed them (its trace propagates shapes); None for a hand-cut
    network, whose shapes a forward on the meta device gives (:mod:`.listing`).
    """

    layer_names: tuple[str, ...]
    default_freeze_index: int
    sample_shapes: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class ModelSpec:
    """An architecture: its builder and the split points the builder makes.

    ``layout`` is the :class:`SplitLayout` itself (hand-cut networks) or a function computing it
    (networks cut at their graph's split points: tracing waits until someone asks).
    ``family`` says where the architecture comes from: ``thesis``, ``torchvision``, ``timm`` or
    ``plugin:<distribution>``.
    """

    name: str
    builder: Builder
    layout: SplitLayout | Callable[[], SplitLayout]
    transform: InputTransform
    has_pretrained: bool
    description: str
    family: str = "thesis"

    @cached_property
    def _layout(self) -> SplitLayout:
        return self.layout if isinstance(self.layout, SplitLayout) else self.layout()

    @property
    def layer_names(self) -> tuple[str, ...]:
        return self._layout.layer_names

    @property
    def default_freeze_index(self) -> int:
        return self._layout.default_freeze_index

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def traced_sample_shapes(self) -> tuple[tuple[int, ...], ...] | None:
        """Each layer's output shape per sample, when tracing the layout computed them."""
        return self._layout.sample_shapes


Resolver = Callable[[str], "ModelSpec | None"]
"""A family's lookup of one name it may know (timm's thousand names are not listed up front)."""

_REGISTRY: dict[str, ModelSpec] = {}
_RESOLVERS: list[Resolver] = []
_RESOLVED: dict[str, ModelSpec] = {}
_BROKEN: dict[str, PluginError] = {}
_discovered = False
_discovery = threading.Lock()


def register(spec: ModelSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"model {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec


def is_registered(name: str) -> bool:
    """Whether ``name`` is registered already (no discovery)."""
    return name in _REGISTRY


def register_resolver(resolver: Resolver) -> None:
    """Add a family that resolves names on demand (tried in order after the registry)."""
    _RESOLVERS.append(resolver)


def mark_broken(name: str, error: PluginError) -> None:
    """Remember an architecture whose plugin failed: asking for it raises ``error``."""
    _BROKEN[name] = error


def broken_plugins() -> dict[str, str]:
    """Each plugin architecture that failed to load, with the cause (after discovery)."""
    _discover()
    return {name: str(error) for name, error in sorted(_BROKEN.items())}


def _discover() -> None:
    """Register the torchvision family and the plugins, once per process."""
    global _discovered
    with _discovery:
        if _discovered:
            return
        from . import plugins  # noqa: PLC0415 - importing plugins is what discovery costs
        from .zoo import graph_families  # noqa: PLC0415

        graph_families.register_torchvision()
        plugins.register_plugins()
        _discovered = True


def list_models() -> list[str]:
    """Names of every listed architecture, sorted: the thesis' seven, every torchvision
    classification network and every installed plugin's (timm's are named on demand)."""
    _discover()
    return sorted(_REGISTRY)


def thesis_models() -> list[str]:
    """The seven hand-cut networks of the thesis (Table 5.2), sorted; no discovery."""
    return sorted(name for name, spec in _REGISTRY.items() if spec.family == "thesis")


def get_spec(name: str) -> ModelSpec:
    """The architecture ``name``.

    Raises:
        UnknownModelError: no family knows the name (the message lists the registry).
        PluginError: the name belongs to a plugin that failed to load.
    """
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    _discover()
    if name in _BROKEN:
        raise _BROKEN[name]
    spec = _REGISTRY.get(name) or _RESOLVED.get(name)
    if spec is None:
        for resolve in _RESOLVERS:
            spec = resolve(name)
            if spec is not None:
                # Kept (its layout is traced once) but not listed: list_models stays the same
                # whatever names were asked for.
                spec = _RESOLVED.setdefault(name, spec)
                break
    if spec is None:
        raise _unknown(name)
    return spec


def _unknown(name: str) -> UnknownModelError:
    """The error for ``name``, whose "did you mean" is a name of the same family."""
    if name.startswith("timm/"):
        # Not the registry's names: "timm/resnet18dd" must suggest "timm/resnet18d", not
        # "resnet18", a torchvision network of another family.
        import timm  # noqa: PLC0415

        known = ["timm/" + model for model in timm.list_models()]
        return UnknownModelError(
            name, known, detail="timm knows no such model: timm.list_models() lists them"
        )
    return UnknownModelError(name, sorted(_REGISTRY))


def get_model(
    name: str,
    num_classes: int = 1000,
    weights: str | Path | bytes | bytearray | memoryview | None = None,
    *,
    sha256: str | None = None,
) -> SplittableModel:
    """Build a registered model.

    ``weights``: ``None`` (random init from torch's global RNG), ``"imagenet"`` (the packaged
    pretrained weights, where the architecture has them offline), a path to a ``.safetensors``
    file, or the safetensors bytes (read in place: a ``bytearray`` or ``memoryview`` is not
    copied). When ``sha256`` is given the blob is verified first.
    """
    from .skip_init import skipped_random_init  # local: torch is imported only to build
    from .weights import load_weights  # local: weights imports the registry for its errors

    spec = get_spec(name)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    pretrained = isinstance(weights, str) and weights == "imagenet"
    if weights is None or pretrained:
        model = spec.builder(num_classes, pretrained)
    else:
        # The strict load below sets every parameter: the random init would be drawn for
        # nothing (seconds for a large network). A blob that does not fit is refused by it.
        with skipped_random_init():
            model = spec.builder(num_classes, pretrained)
        load_weights(model, weights, sha256=sha256)
    model.eval()
    return model
