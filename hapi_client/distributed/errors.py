"""Exception tree of :mod:`hapi_client.distributed`.

Every error raised on purpose here is a :class:`DistributedError`, itself a
:class:`~hapi_client.errors.HapiClientError`, so ``except HapiClientError`` still catches all of
the client's failures::

    DistributedError
    +-- DistributedConfigError      (also ValueError) a setting that cannot work
    +-- ScheduleError               the epoch plan cannot give every worker its samples
    +-- ChannelError                the gradient side channel failed (connect, auth, protocol)
    |   +-- GatherTimeoutError      fewer than q replies before the round's deadline
    +-- ReplicaDivergenceError      replicas no longer hold identical parameters
    +-- LaunchError                 torchrun (the launcher's subprocess) failed

:class:`~hapi_client.errors.TrainingCheckpointError` (a damaged checkpoint, or another run's) is
the client's, shared with the single-process recipe; it is re-exported here.
"""

from __future__ import annotations

from ..errors import HapiClientError, TrainingCheckpointError

__all__ = [
    "ChannelError",
    "DistributedConfigError",
    "DistributedError",
    "GatherTimeoutError",
    "LaunchError",
    "ReplicaDivergenceError",
    "ScheduleError",
    "TrainingCheckpointError",
]


class DistributedError(HapiClientError):
    """Base class of every error raised by :mod:`hapi_client.distributed`."""


class DistributedConfigError(DistributedError, ValueError):
    """A multi-worker setting that cannot work (q > n, attacker rank out of range, ...)."""


class ScheduleError(DistributedError):
    """The epoch cannot be split into per-worker slices (too few samples, sizes that do not add up)."""


class ChannelError(DistributedError):
    """The gradient side channel failed: no connection, a wrong token, a malformed frame."""


class GatherTimeoutError(ChannelError):
    """The aggregator's deadline passed with fewer than q gradients for the round."""

    def __init__(self, message: str, *, round_index: int, received: int, q: int) -> None:
        super().__init__(message)
        self.round_index = round_index
        self.received = received
        self.q = q


class ReplicaDivergenceError(DistributedError):
    """A worker's parameters no longer match the aggregator's (checksums differ)."""


class LaunchError(DistributedError):
    """The torchrun subprocess failed or produced no results."""

    def __init__(self, message: str, *, returncode: int | None = None, log_tail: str = "") -> None:
        super().__init__(message if not log_tail else f"{message}\n--- log tail ---\n{log_tail}")
        self.returncode = returncode
        self.log_tail = log_tail
