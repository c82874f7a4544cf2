"""Networks cut at their graph's split points: every torchvision classification network and timm's.

The thesis' networks keep their hand-cut layers (and their Table 5.2 numbering); every other
name torchvision lists among its classification models is registered here, and any timm model
resolves as ``timm/<name>``. Each is built as its library builds it (``num_classes`` heads
included), then cut by :func:`~hapi_models.graph_split.split_graph`; its input transform is
the one of its library's pretrained weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import PretrainedWeightsUnavailableError, UnknownModelError
from ..graph_split import graph_layout, split_graph
from ..registry import ModelSpec, SplitLayout, is_registered, register, register_resolver
from ..splittable import SplittableModel
from ..transforms import InputTransform

log = logging.getLogger(__name__)

TIMM_PREFIX = "timm/"

# GoogLeNet and Inception-v3 train an auxiliary classifier that their eval graph never runs; it
# is left out (so no layer holds it). init_weights=False skips scipy's slow truncated-normal
# init. Their transform_input is an InputRescale (below), so it travels with the weights.
_TORCHVISION_OPTIONS: dict[str, dict[str, Any]] = {
    "googlenet": {"aux_logits": False, "init_weights": False},
    "inception_v3": {"aux_logits": False, "init_weights": False},
}

#: The ImageNet normalisation torchvision's transform_input undoes: Google's weights were
#: trained on inputs in [-1, 1], i.e. normalised with mean 0.5 and std 0.5.
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
#: The module (and state-dict prefix) that holds the flag, in the networks that have one.
INPUT_RESCALE = "input_rescale"


class InputRescale(nn.Module):
    """torchvision's ``transform_input`` of GoogLeNet and Inception-v3, held as two buffers.

    torchvision turns the flag on with its pretrained weights and off otherwise
    (``googlenet(weights=None)``), and a checkpoint does not record it: a flag fixed in the
    architecture was right for one kind of checkpoint and silently wrong for the other. As
    buffers (``scale``, ``shift``: identity when off) the flag is part of the weights HAPI
    stores, so the server runs what the uploader chose; see
    :func:`hapi_models.import_weights`.
    """

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("shift", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The same two float ops per element as torchvision's, so its features are matched exactly.
        return x * self.scale.view(1, -1, 1, 1) + self.shift.view(1, -1, 1, 1)


def input_rescale_state(arch: str, *, on: bool) -> dict[str, torch.Tensor]:
    """The native state-dict entries of ``arch``'s transform_input (empty where it has none)."""
    if arch not in _TORCHVISION_OPTIONS:
        return {}
    scale = [s / 0.5 for s in _IMAGENET_STD] if on else [1.0, 1.0, 1.0]
    shift = [(m - 0.5) / 0.5 for m in _IMAGENET_MEAN] if on else [0.0, 0.0, 0.0]
    return {
        f"{INPUT_RESCALE}.scale": torch.tensor(scale, device="cpu"),
        f"{INPUT_RESCALE}.shift": torch.tensor(shift, device="cpu"),
    }


def legacy_input_rescale(
    model: nn.Module, state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The entries of ``model``'s :class:`InputRescale` that ``state`` lacks altogether, filled
    in on, with torchvision's constants; empty when the model has none or ``state`` holds any
    of them (a partial set stays for the strict load to refuse).

    Weights stored before the flag became these buffers have no such entries: HAPI then built
    GoogLeNet and Inception-v3 with ``transform_input=True`` always, so on is exactly what they
    were uploaded for.
    """
    on = input_rescale_state("googlenet", on=True)  # the same constants for both networks
    wanted = {
        f"{name}.{buffer}": on[f"{INPUT_RESCALE}.{buffer}"]
        for name, module in model.named_modules()
        if isinstance(module, InputRescale)
        for buffer in ("scale", "shift")
    }
    if not wanted or any(key in state for key in wanted):
        return {}
    return wanted


def _with_input_rescale(base: type[nn.Module]) -> type[nn.Module]:
    """``base`` (GoogLeNet or Inception3) whose transform_input is an :class:`InputRescale`."""

    class Rescaled(base):  # type: ignore[misc,valid-type]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(transform_input=False, **kwargs)
            self.input_rescale = InputRescale()

        def _transform_input(self, x: torch.Tensor) -> torch.Tensor:
            return self.input_rescale(x)  # type: ignore[no-any-return]

    Rescaled.__name__ = Rescaled.__qualname__ = base.__name__
    return Rescaled


NetFactory = Callable[[int], nn.Module]
"""``factory(num_classes) -> nn.Module``: the library's network, randomly initialised."""


def graph_spec(
    name: str,
    factory: NetFactory,
    transform: InputTransform,
    *,
    family: str,
    description: str,
    tracer_kwargs: Mapping[str, Any] | None = None,
) -> ModelSpec:
    """The spec of a network cut at its graph's split points (torchvision, timm, plugins)."""

    def build(num_classes: int, pretrained: bool) -> SplittableModel:
        if pretrained:
            raise PretrainedWeightsUnavailableError(
                f"{name} has no weights packaged with HAPI: pass a checkpoint file "
                "(`hapi upload model --weights FILE`; for torchvision's own, `--weights torchvision`)"
            )
        net = construct(factory, num_classes)
        cut = split_graph(net, name, transform.input_shape, tracer_kwargs=tracer_kwargs)
        return SplittableModel(
            name,
            list(zip(cut.names, cut.layers, strict=True)),
            default_freeze_index=cut.classifier_index,
            transform=transform,
            num_classes=num_classes,
            native=net,
        )

    def layout() -> SplitLayout:
        with torch.device("meta"):  # shapes only: no memory, no initialisation
            net = construct(factory, 1000)
        names, shapes, classifier = graph_layout(
            net, name, transform.input_shape, tracer_kwargs=tracer_kwargs
        )
        return SplitLayout(names, classifier, shapes)

    return ModelSpec(
        name=name,
        builder=build,
        layout=layout,
        transform=transform,
        has_pretrained=False,
        description=description,
        family=family,
    )


def construct(factory: NetFactory, num_classes: int) -> nn.Module:
    """``factory(num_classes)`` on the current default device, in eval mode.

    A builder that computes with tensors while it builds (torchvision's RegNets size their
    stages with ``torch.pow``) cannot run on the meta device; it is built on the CPU and then
    moved there.
    """
    try:
        return factory(num_classes).eval()
    except NotImplementedError:
        if torch.get_default_device().type != "meta":
            raise
    with torch.device("cpu"):
        net = factory(num_classes)
    return net.to("meta").eval()


def _torchvision_factory(name: str, transform: InputTransform) -> NetFactory:
    options = dict(_TORCHVISION_OPTIONS.get(name, {}))
    if name.startswith("vit_"):
        # A ViT's position embedding fixes its input size: that of its weights (ViT-H/14's
        # are 518 pixels), so that they load.
        options["image_size"] = transform.crop

    def factory(num_classes: int) -> nn.Module:
        from torchvision import models  # noqa: PLC0415 - torchvision is slow to import

        if name == "googlenet":
            return _with_input_rescale(models.GoogLeNet)(num_classes=num_classes, **options)
        if name == "inception_v3":
            return _with_input_rescale(models.Inception3)(num_classes=num_classes, **options)
        return models.get_model(name, weights=None, num_classes=num_classes, **options)

    return factory


def _torchvision_transform(name: str) -> InputTransform:
    from torchvision.models import get_model_weights  # noqa: PLC0415

    preset = get_model_weights(name).DEFAULT.transforms()  # type: ignore[attr-defined]
    # HAPI's transform resizes bilinearly; the few networks whose weights were evaluated with
    # bicubic resizing (Swin, MaxViT) see slightly different pixels, as any bilinear pipeline.
    return InputTransform(
        resize=int(preset.resize_size[0]),
        crop=int(preset.crop_size[0]),
        mean=tuple(preset.mean),  # type: ignore[arg-type]
        std=tuple(preset.std),  # type: ignore[arg-type]
    )


def _regnet_widths_on_the_cpu() -> None:
    """Let torchvision's RegNets build on the meta device.

    ``BlockParams.from_init_params`` turns its stage widths into Python ints through tensors
    (``torch.pow``, ``tolist``), which the meta device cannot do, so every RegNet was built
    and initialised on the CPU just to trace it: 14 s for RegNetY-128GF, 30 s of the 70 s that
    listing every network took. The widths are pure numbers, so that one function runs on the
    CPU whatever the default device; the weights are then made where the caller asked.
    Wrapped once per process (torchvision has no hook for this).
    """
    from torchvision.models import regnet  # noqa: PLC0415

    original = regnet.BlockParams.from_init_params
    if getattr(original, "_hapi_on_cpu", False):
        return

    def from_init_params(*args: Any, **kwargs: Any) -> Any:
        with torch.device("cpu"):
            return original(*args, **kwargs)

    from_init_params._hapi_on_cpu = True  # type: ignore[attr-defined]
    regnet.BlockParams.from_init_params = staticmethod(from_init_params)  # type: ignore[method-assign,assignment]


def register_torchvision() -> None:
    """Register every torchvision classification network the thesis' zoo does not cut by hand."""
    import torchvision.models  # noqa: PLC0415

    _regnet_widths_on_the_cpu()
    for name in torchvision.models.list_models(module=torchvision.models):
        if is_registered(name):
            continue  # hand-cut (Table 5.2)
        transform = _torchvision_transform(name)
        register(
            graph_spec(
                name,
                _torchvision_factory(name, transform),
                transform,
                family="torchvision",
                description=f"torchvision {name}, cut at its graph's split points",
                # One layer, holding its buffers: traced into, it would read them across layers.
                tracer_kwargs={"leaf_modules": [InputRescale]}
                if name in _TORCHVISION_OPTIONS
                else None,
            )
        )


def _timm_tracer_kwargs() -> dict[str, Any]:
    from timm.models import get_notrace_functions, get_notrace_modules  # noqa: PLC0415

    return {
        "leaf_modules": list(get_notrace_modules()),
        "autowrap_functions": tuple(get_notrace_functions()),
    }


def _timm_pretrained_cfg(name: str, model: str) -> Any:
    """timm's pretrained configuration of ``model`` (``arch.tag``), or None where it has none.

    Raises:
        UnknownModelError: a tag timm does not know for the architecture, naming the ones it does.
    """
    import timm  # noqa: PLC0415

    try:
        return timm.models.get_pretrained_cfg(model)
    except RuntimeError:  # timm's "Invalid pretrained tag (...) for ...": a name, not a crash
        base, tag = timm.models.split_model_name_tag(model)
        tags = [TIMM_PREFIX + t for t in timm.list_pretrained(f"{base}.*")]
        raise UnknownModelError(
            name,
            tags,
            detail=f"timm knows no tag {tag!r} for {base}; its tags: "
            + ", ".join([*tags, f"or {TIMM_PREFIX}{base} for the default"]),
        ) from None


def resolve_timm(name: str) -> ModelSpec | None:
    """``timm/<model>``: any model timm can create, cut at its graph's split points."""
    if not name.startswith(TIMM_PREFIX):
        return None
    model = name.removeprefix(TIMM_PREFIX)
    import timm  # noqa: PLC0415

    if not timm.is_model(model):
        return None
    cfg = _timm_pretrained_cfg(name, model)
    if cfg is None:  # a model without a pretrained configuration: timm's defaults
        cfg = timm.models.PretrainedCfg()
    _, height, _ = cfg.input_size
    transform = InputTransform(
        resize=round(height / cfg.crop_pct),
        crop=height,
        mean=tuple(cfg.mean),  # type: ignore[arg-type]
        std=tuple(cfg.std),  # type: ignore[arg-type]
    )

    def factory(num_classes: int) -> nn.Module:
        return timm.create_model(model, pretrained=False, num_classes=num_classes)  # type: ignore[no-any-return]

    return graph_spec(
        name,
        factory,
        transform,
        family="timm",
        description=f"timm {model}, cut at its graph's split points",
        tracer_kwargs=_timm_tracer_kwargs(),
    )


register_resolver(resolve_timm)
