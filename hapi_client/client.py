"""The connection: one HAPI endpoint plus the caller's Swift credentials.

:class:`HapiClient` is the bottom of the client package: the Swift session, the transport to
the HAPI server (or Swift's filter), the bandwidth estimate they share and the retry policy.
It imports nothing that trains; what trains (the recipe, the feature dataset, the multi-worker
trainer) sits above it and takes the pieces it needs.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Literal

from hapi_contract import DatasetManifest

from .bandwidth import BandwidthEstimator
from .datasets import DatasetError, load_manifest
from .defaults import DEFAULT_ENDPOINT
from .errors import ConfigurationError, SwiftAccessError
from .progress import quiet_http_warnings
from .retry import RetryPolicy
from .swift_session import SwiftCredentials, SwiftSession
from .throttle import TokenBucket
from .transport import HapiTransport

if TYPE_CHECKING:
    from pathlib import Path

    import hapi_models

    from .defaults import Mode
    from .finetune import FinetuneResult
    from .model_store import StoredModel
    from .options import ExtractOptions, TrainOptions


class HapiClient:
    """Talks to a HAPI server (``via="hapi"``) or to Swift's HAPI filter (``via="swift"``).

    >>> from hapi_client import HapiClient, SwiftCredentials
    >>> with HapiClient("http://127.0.0.1:8090", SwiftCredentials()) as client:
    ...     result = client.finetune(model="models/efficientnet_lite0", container="photos-train")

    A request that fails for a reason that can pass (a service of the stack restarting) is
    retried for ``retry_budget_s`` seconds after its first failure (default
    :data:`~hapi_client.retry.DEFAULT_RETRY_BUDGET_S`, 120 s), then fails with
    ServerUnavailableError or SwiftUnavailableError saying what is likely down; ``retry`` sets
    the back-off too (:class:`~hapi_client.retry.RetryPolicy`).
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
        retry_budget_s: float | None = None,
        throttle_bytes_per_s: float | None = None,
    ) -> None:
        if retry is not None and retry_budget_s is not None:
            raise ConfigurationError("give retry= or retry_budget_s=, not both")
        quiet_http_warnings()  # this client retries on its budget and says so once
        try:
            self.retry = retry or (
                RetryPolicy() if retry_budget_s is None else RetryPolicy(budget_s=retry_budget_s)
            )
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
        self.credentials = credentials or SwiftCredentials()
        self.bandwidth = BandwidthEstimator(override=bandwidth_bytes_per_s)
        # One bucket for every transfer of this client: a link shared by Swift and HAPI traffic.
        self.throttle = TokenBucket(throttle_bytes_per_s) if throttle_bytes_per_s else None
        self.swift = SwiftSession(self.credentials, self.bandwidth, self.throttle, retry=self.retry)
        self.transport = HapiTransport(
            endpoint,
            self.swift,
            via=via,
            timeout_s=timeout_s,
            retry=self.retry,
            bandwidth=self.bandwidth,
            throttle=self.throttle,
        )

    def manifest(self, container: str) -> DatasetManifest:
        try:
            return load_manifest(self.swift.connection(), container)
        except DatasetError as exc:
            raise SwiftAccessError(str(exc)) from exc

    # The recipe's parameters, spelled out so that help(), a notebook's completion and type
    # checkers all see them; tests/hapi_client/test_client_layering.py keeps them equal to
    # run_finetune's.
    def finetune(
        self,
        *,
        model: str | StoredModel,
        container: str,
        eval_container: str | None = None,
        mode: Mode = "hapi",
        train: TrainOptions | None = None,
        extract: ExtractOptions | None = None,
        num_classes: int | None = None,
        transform: hapi_models.InputTransform | None = None,
        device: str = "cpu",
        progress: bool = True,
        max_iterations: int | None = None,
        verify_fraction: float = 0.0,
        preflight: bool = True,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int | None = None,
    ) -> FinetuneResult:
        """The recipe on this connection: :func:`~hapi_client.finetune.run_finetune` (its
        docstring says what each parameter does).

        The recipe is imported only when called (the connection does not load the trainer).
        For a loop of your own, use :class:`~hapi_client.FeatureDataset` instead.
        """
        from .finetune import run_finetune  # the recipe sits above the connection

        return run_finetune(
            self,
            model=model,
            container=container,
            eval_container=eval_container,
            mode=mode,
            train=train,
            extract=extract,
            num_classes=num_classes,
            transform=transform,
            device=device,
            progress=progress,
            max_iterations=max_iterations,
            verify_fraction=verify_fraction,
            preflight=preflight,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
        )

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
