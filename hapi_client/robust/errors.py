"""Exception tree of :mod:`hapi_client.robust`.

Every error raised on purpose by this package is a :class:`RobustAggregationError`, itself a
:class:`~hapi_client.errors.HapiClientError`, so a caller can catch this package with one
``except`` and the whole client with another. The subclasses also derive from the matching
built-in (``ValueError``, ``LookupError``) so generic handlers keep working.
"""

from __future__ import annotations

from ..errors import HapiClientError

__all__ = [
    "BalancingError",
    "ComplexityLimitError",
    "InputMismatchError",
    "InvalidParameterError",
    "MissingRepliesError",
    "NonFiniteInputError",
    "RequirementError",
    "RobustAggregationError",
    "UnknownNameError",
]


class RobustAggregationError(HapiClientError):
    """Base class of every error raised by :mod:`hapi_client.robust`."""


class InvalidParameterError(RobustAggregationError, ValueError):
    """A constructor argument is out of range (negative f, zero step size, unknown mode...)."""


class RequirementError(InvalidParameterError):
    """``n`` and ``f`` break the rule's resilience requirement (e.g. Krum needs n >= 2f+3)."""


class ComplexityLimitError(InvalidParameterError):
    """The rule would be too expensive for these parameters (MDA with a huge C(n, f))."""


class InputMismatchError(RobustAggregationError, ValueError):
    """The inputs handed to a rule do not match it (count != n, mixed shapes/devices/dtypes)."""


class NonFiniteInputError(InputMismatchError):
    """A non-robust rule (average) was given NaN/Inf and was told to refuse it."""


class MissingRepliesError(InputMismatchError):
    """Fewer than q replies arrived, so the server cannot aggregate this round."""


class UnknownNameError(RobustAggregationError, LookupError):
    """A registry lookup used a name that is not registered."""

    def __str__(self) -> str:
        # LookupError/KeyError would repr() the message; keep it readable.
        return str(self.args[0]) if self.args else ""


class BalancingError(RobustAggregationError, ValueError):
    """Bad input to the LB-BSP batch balancer (wrong number of times, negative times...)."""
