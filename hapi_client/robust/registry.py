"""Look rules, pre-aggregation steps and attacks up by name.

``get_aggregator("krum", n=11, f=3)``; with pre-aggregation
``get_aggregator("krum", n=11, f=3, pre=["nnm", ("clipping", {"c": 1.0})])`` builds
``Chain(NNM(11, 3), Clipping(11, 3, c=1.0), Krum(11, 3))``; the rule after a bucketing step is
built for the bucket count. Names are case-insensitive and ``-`` equals ``_``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from torch import Tensor

from ._tensors import Inputs
from .aggregators import (
    MDA,
    Aggregator,
    Average,
    BatchWeightedAverage,
    Bulyan,
    Krum,
    Median,
    MultiKrum,
    TrimmedMean,
)
from .attacks import (
    ALittleIsEnough,
    Attack,
    DropAttack,
    FallOfEmpires,
    NonFiniteAttack,
    RandomAttack,
    ReverseAttack,
)
from .errors import InvalidParameterError, UnknownNameError
from .preaggregation import Bucketing, Chain, Clipping, NearestNeighborMixing, PreAggregator

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

_AGGREGATORS: dict[str, type[Aggregator]] = {
    cls.name: cls
    for cls in (Average, BatchWeightedAverage, Median, TrimmedMean, Krum, MultiKrum, MDA, Bulyan)
}
_PREAGGREGATORS: dict[str, type[PreAggregator]] = {
    cls.name: cls for cls in (NearestNeighborMixing, Bucketing, Clipping)
}
_ATTACKS: dict[str, type[Attack]] = {
    cls.name: cls
    for cls in (
        RandomAttack,
        ReverseAttack,
        DropAttack,
        ALittleIsEnough,
        FallOfEmpires,
        NonFiniteAttack,
    )
}
_ALIASES = {
    "mean": "average",
    "batch_weighted_average": "weighted_average",
    "multikrum": "multi_krum",
    "trmean": "trimmed_mean",
    "minimum_diameter_averaging": "mda",
    "nearest_neighbor_mixing": "nnm",
    "clip": "clipping",
    "reversed": "reverse",
    "dropped": "drop",
    "a_little_is_enough": "alie",
    "little_is_enough": "alie",
    "fall_of_empires": "foe",
    "inner_product_manipulation": "foe",
    "ipm": "foe",
}

T = TypeVar("T")


def _normalise(name: str) -> str:
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    return _ALIASES.get(key, key)


def _lookup(kind: str, table: Mapping[str, type[T]], name: str) -> type[T]:
    if not isinstance(name, str):
        raise UnknownNameError(f"{kind} name must be a string, got {type(name).__name__}")
    try:
        return table[_normalise(name)]
    except KeyError:
        raise UnknownNameError(
            f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}"
        ) from None


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
    return sorted(_AGGREGATORS)


def list_preaggregators() -> list[str]:
    """Registered pre-aggregation step names, sorted."""
    return sorted(_PREAGGREGATORS)


def list_attacks() -> list[str]:
    """Registered attack names, sorted."""
    return sorted(_ATTACKS)


def aggregator_class(name: str) -> type[Aggregator]:
    """The rule class behind ``name`` (e.g. for ``aggregator_class("bulyan").max_f(n)``)."""
    return _lookup("aggregator", _AGGREGATORS, name)


def get_preaggregator(name: str, *, n: int, f: int = 0, **params: object) -> PreAggregator:
    """Build the pre-aggregation step ``name`` for ``n`` inputs (``f`` where it is used)."""
    return _build(_lookup("pre-aggregator", _PREAGGREGATORS, name), n, f, **params)


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
    rule_cls = _lookup("aggregator", _AGGREGATORS, name)
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
    return _build(_lookup("attack", _ATTACKS, name), **params)
