"""Exception tree of :mod:`hapi_client` (like httpx: one base, specific subclasses)."""

from __future__ import annotations


class HapiClientError(Exception):
    """Base class of every error raised by the HAPI client."""


class ConfigurationError(HapiClientError, ValueError):
    """An argument that cannot work (unknown mode, bad split, bad batch size...)."""


class SwiftAccessError(HapiClientError):
    """Swift refused or could not be reached (auth, missing container or object)."""


class ServerError(HapiClientError):
    """The HAPI server answered with an error status (after retries where retrying makes sense)."""

    def __init__(self, status: int, detail: str, code: str = "") -> None:
        super().__init__(f"HAPI server answered {status}: {detail}")
        self.status = status
        self.detail = detail
        self.code = code


class ServerUnavailableError(HapiClientError):
    """The HAPI server could not be reached, or kept failing, within the retry budget."""


class DeliveryError(HapiClientError):
    """Samples were lost or duplicated: the epoch cannot be completed exactly once."""
