"""Exception tree of :mod:`hapi_client` (like httpx: one base, specific subclasses)::

HapiClientError                   every error the client raises on purpose
├── ConfigurationError            (also ValueError) an argument that cannot work
├── SwiftAccessError              Swift refused (401, 403, 404) or could not be reached
│   ├── SwiftUnavailableError       ... unreachable, or still 5xx when the retry budget ran out
│   └── datasets.SwiftError         (also DatasetError) a dataset upload/listing request failed
├── ServerError                   the HAPI server answered an error that retrying cannot fix
├── ServerUnavailableError        the HAPI server unreachable or failing for the retry budget
├── DeliveryError                 samples lost or duplicated
├── VerificationError             features from the server differ from the local recomputation
├── TrainingCheckpointError       a checkpoint that is damaged or belongs to another run
├── datasets.DatasetError         building, uploading or reading a dataset (hapi_client.datasets)
│   ├── SourceError, SourceSpecError, DatasetNotFoundError, CorruptDatasetError
│   └── SwiftError (also SwiftAccessError): SwiftAuthError
├── robust.RobustAggregationError aggregation rules, attacks, balancing (hapi_client.robust)
│   ├── InvalidParameterError (also ValueError): RequirementError, ComplexityLimitError
│   ├── InputMismatchError (also ValueError): NonFiniteInputError, MissingRepliesError
│   ├── UnknownNameError (also LookupError)
│   └── BalancingError (also ValueError)
└── distributed.DistributedError  multi-worker training (hapi_client.distributed)
    ├── DistributedConfigError (also ValueError), ScheduleError, ReplicaDivergenceError
    ├── ChannelError: GatherTimeoutError
    └── LaunchError

Each subpackage keeps its own module of errors (``hapi_client.datasets.errors``,
``hapi_client.robust.errors``, ``hapi_client.distributed.errors``) whose base derives from
:class:`HapiClientError`, so ``except HapiClientError`` catches every failure of the client.
Handlers choose by type, never by message text.
"""

from __future__ import annotations


class HapiClientError(Exception):
    """Base class of every error raised by the HAPI client."""


class ConfigurationError(HapiClientError, ValueError):
    """An argument that cannot work (unknown mode, bad split, bad batch size...)."""


class SwiftAccessError(HapiClientError):
    """Swift refused or could not be reached (auth, missing container or object)."""


class SwiftUnavailableError(SwiftAccessError):
    """Swift did not answer, or answered 5xx, and still did when the retry budget ran out.

    ``endpoint`` is ``"auth"`` (tempauth's ``/auth/v1.0``) or ``"storage"`` (an object read);
    ``status`` is Swift's last HTTP status, None when it did not answer at all. The message says
    what is likely down and how to bring it back.
    """

    def __init__(self, message: str, *, endpoint: str, status: int | None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status


class ServerError(HapiClientError):
    """The HAPI server answered with an error status (after retries where retrying makes sense)."""

    def __init__(self, status: int, detail: str, code: str = "") -> None:
        super().__init__(f"HAPI server answered {status}: {detail}")
        self.status = status
        self.detail = detail
        self.code = code


class ServerUnavailableError(HapiClientError):
    """The HAPI server could not be reached, or kept failing, within the retry budget.

    ``status`` is its last HTTP status (None: no answer, e.g. connection refused or a stream cut);
    ``code`` the JSON ``code`` of that answer ("" if none).
    """

    def __init__(self, message: str, *, status: int | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class DeliveryError(HapiClientError):
    """Samples were lost or duplicated: the epoch cannot be completed exactly once."""


class VerificationError(HapiClientError):
    """Pushdown verification found features or labels that the local model does not reproduce."""


class TrainingCheckpointError(HapiClientError):
    """A checkpoint that cannot be resumed from: damaged, of another run, or (multi-worker) not
    the same on every rank (the directory must be one that all ranks see).

    Raised by the single-process recipe and by :mod:`hapi_client.distributed` alike (both write
    through :mod:`hapi_client.checkpoint_store`).
    """
