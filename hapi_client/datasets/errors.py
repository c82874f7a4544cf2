"""The exception tree of ``hapi_client.datasets``::

    DatasetError
    +-- SourceError                 a sample source cannot be built or read
    |   +-- SourceSpecError         a source spec string cannot be parsed
    +-- SwiftError                  talking to Swift failed (also hapi_client.SwiftAccessError)
    |   +-- SwiftAuthError          Swift rejected the credentials (401) or the access (403)
    +-- DatasetNotFoundError        the container or its manifest does not exist
    +-- CorruptDatasetError         the stored manifest is invalid
    +-- DatasetIndexError           data in Swift cannot be indexed in place (names the object)
    +-- IndexInterruptedError       indexing stopped on request; running it again continues

``DatasetError`` derives from :class:`hapi_client.errors.HapiClientError`, the client's one root.
A Swift that cannot be reached (connection refused, DNS, timeout) is the client's own
:class:`hapi_client.errors.SwiftUnavailableError`, re-exported here; errors of the shard/manifest
format itself are ``hapi_contract.dataset.DatasetFormatError``.
"""

from __future__ import annotations

from ..errors import HapiClientError, SwiftAccessError, SwiftUnavailableError

__all__ = [
    "CorruptDatasetError",
    "DatasetError",
    "DatasetIndexError",
    "DatasetNotFoundError",
    "IndexInterruptedError",
    "SourceError",
    "SourceSpecError",
    "SwiftAuthError",
    "SwiftError",
    "SwiftUnavailableError",
]


class DatasetError(HapiClientError):
    """Base class of every error raised by ``hapi_client.datasets`` (part of the client's tree)."""


class SourceError(DatasetError):
    """A sample source cannot be built or read (missing folder, no images, bad file...)."""


class SourceSpecError(SourceError):
    """A source spec string (``fashion-mnist:train``, ``photos:test?per_class=5``) is invalid."""


class SwiftError(DatasetError, SwiftAccessError):
    """A Swift request failed; the message names the operation, object and status."""


class SwiftAuthError(SwiftError):
    """Swift rejected the credentials (401) or denied the access (403)."""


class DatasetNotFoundError(DatasetError):
    """The dataset container or its manifest does not exist."""


class CorruptDatasetError(DatasetError):
    """The manifest stored in Swift is not a valid dataset manifest."""


class DatasetIndexError(DatasetError):
    """Data in Swift cannot be indexed in place; ``object_name`` is the object at fault, if one."""

    def __init__(self, message: str, *, object_name: str | None = None) -> None:
        super().__init__(message)
        self.object_name = object_name


class IndexInterruptedError(DatasetError):
    """Indexing stopped on request before the manifest was written; running it again continues."""
