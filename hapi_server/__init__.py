"""The HAPI server: split feature extraction next to OpenStack Swift, with batch adaptation."""

from .app import create_app
from .errors import (
    ChecksumError,
    ForbiddenError,
    HapiServerError,
    InsufficientMemoryError,
    InvalidRequestError,
    InvalidShardError,
    NotFoundError,
    PayloadTooLargeError,
    QueueFullError,
    RequestTimeoutError,
    SwiftUnavailableError,
    UnauthorizedError,
)
from .settings import ServerSettings, get_settings
from .solver import Demand, InfeasibleRequestError, Plan, solve

__all__ = [
    "ChecksumError",
    "Demand",
    "ForbiddenError",
    "HapiServerError",
    "InfeasibleRequestError",
    "InsufficientMemoryError",
    "InvalidRequestError",
    "InvalidShardError",
    "NotFoundError",
    "PayloadTooLargeError",
    "Plan",
    "QueueFullError",
    "RequestTimeoutError",
    "ServerSettings",
    "SwiftUnavailableError",
    "UnauthorizedError",
    "create_app",
    "get_settings",
    "solve",
]
