"""Look rules, pre-aggregation steps and attacks up by name.

``get_aggregator("krum", n=11, f=3)``; with pre-aggregation
``get_aggregator("krum", n=11, f=3, pre=["nnm", ("clipping", {"c": 1.0})])`` builds
``Chain(NNM(11, 3), Clipping(11, 3, c=1.0), Krum(11, 3))``; the rule after a bucketing step is
built for the bucket count. Names are case-insensitive and ``-`` equals ``_``.

A class is registered where it is defined (``class Krum(MultiKrum, name="krum")``, see
:mod:`.names`); this module only looks the names up and builds.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from torch import Tensor

from ._tensors import Inputs
from .aggregators import Aggregator
from .attacks import Attack
from .errors import InvalidParameterError
from .names import AGGREGATORS, ATTACKS, PREAGGREGATORS
from .preaggregation import Chain, PreAggregator

__all__ = [
    "AggregationRule",
    "PreStep",
    "aggregator_class",
    "get_aggregator",
    "get_attack",
    "get_preaggregator",
    "list_aggregators",
    "list_attacks",
    "list_preaggregators",
]


class AggregationRule(Protocol):
    """What :func:`get_aggregator` returns: a rule or a :class:`Chain` ending in one."""

    n: int
    f: int

    def __call__(self, inputs: Inputs) -> Tensor: ...


#: One entry of ``pre``: a step name, or (name, parameters).
PreStep = str | tuple[str, Mapping[str, object]]

T = TypeVar("T")


def _build(cls: type[T], *args: object, **params: object) -> T:
    try:
        return cls(*args, **params)
    except TypeError as exc:
        accepted = [
            p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "n", "f")
        ]
        raise InvalidParameterError(
            f"{cls.__name__}: bad parameters {sorted(params)} ({exc}); accepted: {accepted}"
        ) from exc


def list_aggregators() -> list[str]:
    """Registered rule names, sorted."""
    return sorted(AGGREGATORS.load())


def list_preaggregators() -> list[str]:
    """Registered pre-aggregation step names, sorted."""
    return sorted(PREAGGREGATORS.load())


def list_attacks() -> list[str]:
    """Registered attack names, sorted."""
    return sorted(ATTACKS.load())


def aggregator_class(name: str) -> type[Aggregator]:
    """The rule class behind ``name`` (e.g. for ``aggregator_class("bulyan").max_f(n)``)."""
    return AGGREGATORS.lookup(name)


def get_preaggregator(name: str, *, n: int, f: int = 0, **params: object) -> PreAggregator:
    """Build the pre-aggregation step ``name`` for ``n`` inputs (``f`` where it is used)."""
    return _build(PREAGGREGATORS.lookup(name), n, f, **params)


def get_aggregator(
    name: str,
    *,
    n: int,
    f: int = 0,
    pre: Sequence[PreStep] | None = None,
    **params: object,
) -> AggregationRule:
    """Build rule ``name`` for ``n`` inputs and ``f`` declared Byzantine ones.

    ``params`` go to the rule (e.g. ``m`` for Multi-Krum, ``max_subsets`` for MDA). ``pre``
    lists pre-aggregation steps applied first, in order; each gets the same ``f`` and the
    number of vectors the previous step outputs. Raises
    :class:`~hapi_client.robust.errors.RequirementError` when (n, f) breaks a requirement and
    :class:`~hapi_client.robust.errors.UnknownNameError` for an unknown name.
    """
    rule_cls = AGGREGATORS.lookup(name)
    if not pre:
        return _build(rule_cls, n, f, **params)
    steps: list[PreAggregator] = []
    count = n
    for entry in pre:
        if isinstance(entry, str):
            step_name, step_params = entry, {}
        else:
            step_name, step_params = entry[0], dict(entry[1])
        step = get_preaggregator(step_name, n=count, f=f, **step_params)
        steps.append(step)
        count = step.output_count
    return Chain(*steps, _build(rule_cls, count, f, **params))


def get_attack(name: str, **params: object) -> Attack:
    """Build attack ``name`` (e.g. ``get_attack("alie", n_byzantine=3)``)."""
    return _build(ATTACKS.lookup(name), **params)
