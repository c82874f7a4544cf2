"""The client object: one HAPI endpoint plus the caller's Swift credentials."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Literal

from hapi_contract import DatasetManifest

from .bandwidth import BandwidthEstimator
from .datasets import DatasetError, load_manifest
from .errors import SwiftAccessError
from .finetune import FinetuneResult, run_finetune
from .swift_session import SwiftCredentials, SwiftSession
from .throttle import TokenBucket
from .transport import HapiTransport, RetryPolicy

DEFAULT_ENDPOINT = "http://127.0.0.1:8090"


class HapiClient:
    """Talks to a HAPI server (``via="hapi"``) or to Swift's HAPI filter (``via="swift"``).

    >>> from hapi_client import HapiClient, SwiftCredentials
    >>> with HapiClient("http://127.0.0.1:8090", SwiftCredentials()) as client:
    ...     result = client.finetune(model="models/efficientnet_lite0", container="photos-train")
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        credentials: SwiftCredentials | None = None,
        *,
        via: Literal["hapi", "swift"] = "hapi",
        bandwidth_bytes_per_s: float | None = None,
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        throttle_bytes_per_s: float | None = None,
    ) -> None:
        self.credentials = credentials or SwiftCredentials()
        self.bandwidth = BandwidthEstimator(override=bandwidth_bytes_per_s)
        # One bucket for every transfer of this client: a link shared by Swift and HAPI traffic.
        self.throttle = TokenBucket(throttle_bytes_per_s) if throttle_bytes_per_s else None
        self.swift = SwiftSession(self.credentials, self.bandwidth, self.throttle)
        self.transport = HapiTransport(
            endpoint,
            self.swift,
            via=via,
            timeout_s=timeout_s,
            retry=retry,
            bandwidth=self.bandwidth,
            throttle=self.throttle,
        )

    def manifest(self, container: str) -> DatasetManifest:
        try:
            return load_manifest(self.swift.connection(), container)
        except DatasetError as exc:
            raise SwiftAccessError(str(exc)) from exc

    def finetune(self, **options: Any) -> FinetuneResult:
        """Fine-tune a model stored in Swift on a dataset container; see :func:`run_finetune`."""
        return run_finetune(self, **options)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> HapiClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
