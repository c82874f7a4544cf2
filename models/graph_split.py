"""Split points of any traceable network: the cuts of its torch.fx graph where one tensor is alive.

The thesis' seven networks are cut by hand into layer lists (Table 5.2); every other network is
cut where its computation graph allows it. torchvision's feature-extraction tracer (the one
``torchvision.models.feature_extraction`` uses, leaf modules and wrapped functions included, so
Swin and MaxViT trace too) records the network as a graph of nodes in execution order, each
named by its module path. Walking that order, a position is a *split point* when exactly one
value computed so far is still needed later and that value is a tensor: everything after the
position depends on the input only through that tensor, so the head can stop there and ship it
(thesis §5.4: the split layer's output is what crosses the network). Residual blocks, dense
blocks and attention blocks are atomic by construction, since their skip connections keep two
values alive inside them.

Parameters and buffers (``get_attr`` nodes) are not values that flow: each layer reads the ones
it uses from the shared modules, so they never count as alive and never cross a cut.

Each layer between two consecutive split points becomes an ``fx.GraphModule`` of its own that
takes one tensor and returns one; they reference the network's own modules, so head and tail
share its parameters as the hand-cut layers do.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import fx, nn

from .errors import UntraceableModelError

log = logging.getLogger(__name__)

__all__ = ["GraphLayers", "graph_layout", "split_graph"]

_Tracer = TypeVar("_Tracer", bound=fx.Tracer)


@dataclass(frozen=True)
class GraphLayers:
    """A network cut at its split points.

    ``layers[i]`` maps the output of ``layers[i - 1]`` (the image batch for ``i = 0``) to its
    own; ``names[i]`` is the module path of the node it ends with; ``sample_shapes[i]`` is the
    shape of one sample's output of layer ``i`` at the traced input size; ``classifier_index``
    is the layer holding the network's last linear (or 1x1 convolution) layer, which
    fine-tuning trains.
    """

    layers: list[nn.Module]
    names: tuple[str, ...]
    sample_shapes: tuple[tuple[int, ...], ...]
    classifier_index: int


def split_graph(
    net: nn.Module,
    arch: str,
    input_shape: Sequence[int],
    *,
    tracer_kwargs: Mapping[str, Any] | None = None,
) -> GraphLayers:
    """Cut ``net`` (in eval mode) at every single-tensor split point of its graph.

    ``input_shape`` is one sample's ``(C, H, W)``: the shapes are propagated with fake tensors,
    so no real forward pass runs and a network on the meta device works as well.
    ``tracer_kwargs`` add leaf modules or wrapped functions to torchvision's defaults (timm's
    untraceable modules, a plugin's own).

    Raises:
        UntraceableModelError: the network cannot be traced, takes more than one input, or
            returns something other than one tensor; the message says which and why.
    """
    cut = _cut(net, arch, input_shape, tracer_kwargs)
    layers: list[nn.Module] = []
    for (start, entering), (end, leaving) in zip(cut.points, cut.points[1:], strict=False):
        layers.append(
            _layer(cut.graph_module, net, cut.nodes[start + 1 : end + 1], entering, leaving)
        )
    return GraphLayers(layers, cut.names, cut.shapes, cut.classifier_index(net))


def graph_layout(
    net: nn.Module,
    arch: str,
    input_shape: Sequence[int],
    *,
    tracer_kwargs: Mapping[str, Any] | None = None,
) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...], int]:
    """:func:`split_graph`'s names, sample shapes and classifier index, without its layers.

    What listing a network needs: building each layer's ``fx.GraphModule`` (Python code
    generated and compiled per layer) took about a quarter of a listing's time.

    Raises:
        UntraceableModelError: as :func:`split_graph`.
    """
    cut = _cut(net, arch, input_shape, tracer_kwargs)
    return cut.names, cut.shapes, cut.classifier_index(net)


@dataclass(frozen=True)
class _Cut:
    """A traced graph with its shapes, and its split points as :func:`_split_points` gives them."""

    graph_module: fx.GraphModule
    nodes: list[fx.Node]
    points: list[tuple[int, fx.Node]]
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    def classifier_index(self, net: nn.Module) -> int:
        """The last layer that calls a linear layer (or a 1x1 convolution: SqueezeNet's
        classifier), itself or inside a module it calls; the last layer when none does."""
        found = len(self.names) - 1
        spans = zip(self.points, self.points[1:], strict=False)
        for index, ((start, _), (end, _)) in enumerate(spans):
            called = (
                str(n.target) for n in self.nodes[start + 1 : end + 1] if n.op == "call_module"
            )
            if any(_is_classifier(m) for t in called for m in net.get_submodule(t).modules()):
                found = index
        return found


def _cut(
    net: nn.Module, arch: str, input_shape: Sequence[int], tracer_kwargs: Mapping[str, Any] | None
) -> _Cut:
    graph_module, qualnames = _trace(net, arch, tracer_kwargs)
    _drop_default_guards(graph_module.graph, arch)
    nodes = list(graph_module.graph.nodes)
    output = nodes[-1]
    result = output.args[0]
    if not isinstance(result, fx.Node):
        raise UntraceableModelError(
            f"{arch}: forward returns {type(result).__name__}, not one tensor (in eval mode)"
        )
    _propagate_shapes(graph_module, arch, input_shape)
    points = _split_points(nodes)
    if not points or points[-1][1] is not result:
        raise UntraceableModelError(f"{arch}: the output is not a tensor the graph computes")
    names = tuple(qualnames.get(node, node.name) for _, node in points[1:])
    shapes = tuple(tuple(node.meta["tensor_meta"].shape[1:]) for _, node in points[1:])
    return _Cut(graph_module, nodes, points, names, shapes)


def _trace(
    net: nn.Module, arch: str, extra: Mapping[str, Any] | None
) -> tuple[fx.GraphModule, dict[fx.Node, str]]:
    # Imported here: torchvision takes seconds to import and only building a model needs it.
    from torchvision.models import feature_extraction  # noqa: PLC0415

    # The defaults create_feature_extractor traces with (torchvision.ops' wrapped functions and
    # leaf modules); torchvision exposes them only through this helper.
    kwargs = feature_extraction._set_default_tracer_kwargs(
        {k: list(v) if k != "autowrap_modules" else tuple(v) for k, v in (extra or {}).items()}
    )
    tracer = _thread_bound(feature_extraction.NodePathTracer)(**kwargs)
    net.eval()
    try:
        graph = tracer.trace(net, concrete_args=_defaults_after_input(net))
    except Exception as exc:  # noqa: BLE001 - any failure of symbolic tracing is the same refusal
        raise UntraceableModelError(
            f"{arch} cannot be split: torch.fx cannot trace it ({type(exc).__name__}: {exc})"
        ) from exc
    graph_module = fx.GraphModule(tracer.root, graph, type(net).__name__)
    return graph_module, dict(tracer.node_to_qualname)


def _thread_bound(tracer_class: type[_Tracer]) -> type[_Tracer]:
    """``tracer_class``, tracing only the calls made in the thread that traces.

    While it traces, torch.fx patches ``nn.Module.__call__`` and ``__getattr__`` for the whole
    process, not the tracing thread alone: a server that builds one request's model while it runs
    another's head would see that forward routed into the trace (``NameError: module is not
    installed as a submodule``). torch.fx has no per-thread switch, so the tracer hands every call
    from another thread straight back to the module as if no trace were under way.
    """

    class ThreadBoundTracer(tracer_class):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._owner = threading.get_ident()

        def call_module(
            self,
            m: nn.Module,
            forward: Callable[..., Any],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            if threading.get_ident() != self._owner:
                return forward(*args, **kwargs)
            return super().call_module(m, forward, args, kwargs)

        def getattr(
            self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, fx.Proxy]
        ) -> Any:
            if threading.get_ident() != self._owner:
                return attr_val
            return super().getattr(attr, attr_val, parameter_proxy_cache)

    return ThreadBoundTracer


def _defaults_after_input(net: nn.Module) -> dict[str, Any]:
    """Every optional argument of ``forward`` after the first, held at its default.

    Networks take options beside the image (timm's ViT an attention mask); a split model
    runs them as called with the image alone.
    """
    parameters = list(inspect.signature(net.forward).parameters.values())[1:]
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _drop_default_guards(graph: fx.Graph, arch: str) -> None:
    """Remove the arguments held at their defaults and the checks torch.fx made of them.

    Tracing keeps each such argument as a placeholder and asserts, at every call, that it still
    has the traced value; a layer is called with the image alone, so the checks go.
    """
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for extra in placeholders[1:]:
        reached: list[fx.Node] = []
        todo = [extra]
        while todo:
            node = todo.pop()
            if node.op == "output":
                raise UntraceableModelError(
                    f"{arch}: its output depends on the argument {extra.name!r} beside the image; "
                    "a splittable model takes the image batch alone"
                )
            reached.append(node)
            todo.extend(node.users)
        for node in sorted(set(reached), key=list(graph.nodes).index, reverse=True):
            graph.erase_node(node)


def _propagate_shapes(graph_module: fx.GraphModule, arch: str, input_shape: Sequence[int]) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415
    from torch.fx.passes.shape_prop import ShapeProp  # noqa: PLC0415

    tensors = itertools.chain(graph_module.parameters(), graph_module.buffers())
    device = next((t.device for t in tensors), torch.device("cpu"))
    # Two samples, so that no dimension of size one hides the batch dimension. Meta tensors
    # carry shapes already; real ones are stood in for by fake tensors, so nothing is computed.
    example = torch.empty((2, *input_shape), device=device)
    fake = None if device.type == "meta" else FakeTensorMode(allow_non_fake_inputs=True)
    try:
        ShapeProp(graph_module, fake_mode=fake).propagate(example)
    except Exception as exc:  # noqa: BLE001 - the network refuses this input, whatever the op
        raise UntraceableModelError(
            f"{arch} does not run on a {tuple(input_shape)} input ({type(exc).__name__}: {exc})"
        ) from exc


def _split_points(nodes: list[fx.Node]) -> list[tuple[int, fx.Node]]:
    """``(position, node)``: after ``nodes[position]`` only ``node``, a tensor, is still needed.

    Where several positions leave the same tensor alive (nodes without users, such as
    ``torch._assert``, follow it) the last one counts, so those nodes stay with their layer.
    """
    position = {node: i for i, node in enumerate(nodes)}
    last_use = {
        node: max((position[u] for u in node.users), default=i) for i, node in enumerate(nodes)
    }
    alive: set[fx.Node] = set()
    found: dict[fx.Node, int] = {}
    for i, node in enumerate(nodes[:-1]):
        if node.op != "get_attr":
            alive.add(node)
        alive = {n for n in alive if last_use[n] > i}
        if len(alive) == 1:
            (only,) = alive
            if _is_tensor(only):
                found[only] = i
    return sorted(((i, node) for node, i in found.items()), key=lambda item: item[0])


def _is_tensor(node: fx.Node) -> bool:
    from torch.fx.passes.shape_prop import TensorMetadata  # noqa: PLC0415

    return isinstance(node.meta.get("tensor_meta"), TensorMetadata)


def _layer(
    graph_module: fx.GraphModule,
    net: nn.Module,
    nodes: list[fx.Node],
    entering: fx.Node,
    leaving: fx.Node,
) -> fx.GraphModule:
    # Not torch.fx.passes.split_module: it turns every parameter a partition reads through
    # get_attr into an extra input of that partition, and a layer here must take exactly the
    # one tensor a split ships.
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {entering: graph.placeholder("x")}
    for node in nodes:
        if node.op == "get_attr":
            continue  # copied into each layer that reads it, below
        for used in node.all_input_nodes:
            if used in env:
                continue
            if used.op != "get_attr":
                raise AssertionError(f"{node.name} reads {used.name} across a split point")
            env[used] = graph.node_copy(used)
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(env[leaving])
    layer = fx.GraphModule(graph_module, graph, "Layer")
    _keep_constants_out_of_state(layer, net)
    return layer


def _keep_constants_out_of_state(layer: fx.GraphModule, source: nn.Module) -> None:
    """Make the tensors tracing created (``_tensor_constantN``) non-persistent buffers.

    GraphModule registers every tensor a graph reads as a buffer, so these would enter the
    state dict, where no checkpoint of the network has them; they are computed, not learned.
    """
    state = {name for name, _ in source.named_parameters()} | {
        name for name, _ in source.named_buffers()
    }
    for node in layer.graph.nodes:
        if node.op != "get_attr" or node.target in state:
            continue
        owner_path, _, leaf = str(node.target).rpartition(".")
        owner = layer.get_submodule(owner_path)
        value = getattr(owner, leaf)
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
            del owner._buffers[leaf]  # re-registered below: register_buffer refuses a name in use
            owner.register_buffer(leaf, value, persistent=False)


def _is_classifier(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    return isinstance(module, nn.Conv2d) and math.prod(module.kernel_size) == 1
