"""The extraction core: one extraction, the same in the HAPI server and inside the Swift proxy.

Model admission (:mod:`~hapi_core.admission`: architecture, split, weights' size, sha256 and
the verified-weights cache), shard and image checks (:mod:`~hapi_core.inputs`), the memory
planner with its admission (:mod:`~hapi_core.adaptation`, :mod:`~hapi_core.solver`,
:mod:`~hapi_core.estimates`), head execution and frame encoding (:mod:`~hapi_core.engine`) and
layer timing (:mod:`~hapi_core.timing`), with the steps of a request written once as flows
(:mod:`~hapi_core.flow`, :mod:`~hapi_core.extraction`) and answered alike by both hosts
(:mod:`~hapi_core.answers`). It imports no web framework: the HAPI
server adds its FastAPI routes and settings, the Swift filter its WSGI glue and the proxy's
thread pool. Both answer the same input with the same status and code.

Importing the package loads no torch (PEP 562): the Swift filter imports its errors and
settings at proxy start, and torch only when an in-proxy filter is built.
"""

from typing import TYPE_CHECKING

from hapi_contract.lazy import attach

if TYPE_CHECKING:
    from .adaptation import AsyncioTimers, DeviceScheduler, Reservation, Ticket, Timers
    from .admission import admit_model, build_model, check_token, check_weights, input_transform
    from .answers import extract_headers, raising_server_errors, stream_error, validation_detail
    from .devices import Device
    from .engine import (
        BatchExecutionError,
        ExtractionJob,
        JobCancelled,
        JobStats,
        iter_frames,
        run_extraction,
    )
    from .errors import (
        ChecksumError,
        ForbiddenError,
        HapiCoreError,
        InsufficientMemoryError,
        InvalidNameError,
        InvalidRequestError,
        InvalidShardError,
        NotFoundError,
        ObjectChangedError,
        PayloadTooLargeError,
        QueueFullError,
        RequestTimeoutError,
        StorageRefusedError,
        StorageUnavailableError,
        UnauthorizedError,
    )
    from .extraction import (
        ModelPlan,
        PreparedExtraction,
        SharedExtraction,
        abandon,
        conclude,
        finish,
        job_of,
        load_planned,
        pin_if_resident,
        plan_weights,
        prepare,
        prepare_extraction,
        read_named_samples,
        read_samples,
        release_model,
        reserve_and_load,
        source_of,
    )
    from .flow import (
        Await,
        Compute,
        Effect,
        Flow,
        Get,
        GetMany,
        Head,
        ObjectInfo,
        ReadWindow,
        Reserve,
        StoredObject,
        run_async,
        run_blocking,
    )
    from .forward_turns import ForwardTurns
    from .host_allocator import bound_host_allocator
    from .metrics import Metrics
    from .roofline import RooflineMeter, roofline_images_per_s
    from .runtime import CoreRuntime
    from .settings import CoreSettings
    from .shared_features import (
        Computation,
        FeatureKey,
        FeatureStore,
        Joined,
        RecordingEncoder,
        SharedFeatures,
        feature_key,
        reframe,
    )
    from .solver import Demand, InfeasibleRequestError, Plan, Releases, solve
    from .timing import time_head, time_request

__getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "AsyncioTimers",
    "Await",
    "BatchExecutionError",
    "ChecksumError",
    "Computation",
    "Compute",
    "CoreRuntime",
    "CoreSettings",
    "Demand",
    "Device",
    "DeviceScheduler",
    "Effect",
    "ExtractionJob",
    "FeatureKey",
    "FeatureStore",
    "Flow",
    "ForbiddenError",
    "ForwardTurns",
    "Get",
    "GetMany",
    "HapiCoreError",
    "Head",
    "InfeasibleRequestError",
    "InsufficientMemoryError",
    "InvalidNameError",
    "InvalidRequestError",
    "InvalidShardError",
    "JobCancelled",
    "JobStats",
    "Joined",
    "Metrics",
    "ModelPlan",
    "NotFoundError",
    "ObjectChangedError",
    "ObjectInfo",
    "PayloadTooLargeError",
    "Plan",
    "PreparedExtraction",
    "QueueFullError",
    "ReadWindow",
    "RecordingEncoder",
    "Releases",
    "RequestTimeoutError",
    "Reservation",
    "Reserve",
    "RooflineMeter",
    "SharedExtraction",
    "SharedFeatures",
    "StorageRefusedError",
    "StorageUnavailableError",
    "StoredObject",
    "Ticket",
    "Timers",
    "UnauthorizedError",
    "abandon",
    "admit_model",
    "bound_host_allocator",
    "build_model",
    "check_token",
    "check_weights",
    "conclude",
    "extract_headers",
    "feature_key",
    "finish",
    "input_transform",
    "iter_frames",
    "job_of",
    "load_planned",
    "pin_if_resident",
    "plan_weights",
    "prepare",
    "prepare_extraction",
    "raising_server_errors",
    "read_named_samples",
    "read_samples",
    "reframe",
    "release_model",
    "reserve_and_load",
    "roofline_images_per_s",
    "run_async",
    "run_blocking",
    "run_extraction",
    "solve",
    "source_of",
    "stream_error",
    "time_head",
    "time_request",
    "validation_detail",
]
