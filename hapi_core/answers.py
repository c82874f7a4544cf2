"""The answers every host gives alike: an extraction's headers, how a failure becomes a status.

The headers of an extraction's 200 (:func:`extract_headers`), how a failure after the status
line becomes an error frame (:func:`stream_error`) and a blocking answer's failure an error of
ours (:func:`raising_server_errors`), and the detail of a request that fails its schema
(:func:`validation_detail`). The HAPI server and the Swift filter's in-proxy execution both
answer through these functions, so the same failure gets the same status and code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import hapi_models
import torch

from hapi_contract import HEADER_COS_BATCH_SIZE, HEADER_DEVICE, HEADER_REQUEST_ID, HEADER_SAMPLES

from .engine import BatchExecutionError
from .errors import HapiCoreError, InsufficientMemoryError, InvalidShardError

P = ParamSpec("P")
T = TypeVar("T")

__all__ = ["extract_headers", "raising_server_errors", "stream_error", "validation_detail"]


def extract_headers(request_id: str, device: str, batch_size: int, samples: int) -> dict[str, str]:
    """The headers of an extraction's 200: what the server decided for the request."""
    return {
        HEADER_REQUEST_ID: request_id,
        HEADER_DEVICE: device,
        HEADER_COS_BATCH_SIZE: str(batch_size),
        HEADER_SAMPLES: str(samples),
    }


def stream_error(exc: BaseException) -> tuple[int, str]:
    """The status and detail of the error frame for a failure after the status line went out.

    Chosen by type alone: the server's own errors keep theirs; an image body that does not
    decode is 422; memory that ran out is 507 (``torch.OutOfMemoryError`` from CUDA,
    ``MemoryError`` from Python or Pillow, and :class:`~hapi_core.engine.BatchExecutionError`,
    see there); anything else is 500.
    """
    if isinstance(exc, HapiCoreError):
        return exc.status, exc.detail
    detail = f"{type(exc).__name__}: {exc}"[:2000]
    if isinstance(exc, hapi_models.ImageDecodeError):
        return InvalidShardError.status, detail
    if isinstance(exc, torch.OutOfMemoryError | MemoryError | BatchExecutionError):
        return InsufficientMemoryError.status, detail
    return 500, detail


def raising_server_errors(work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``work`` (a blocking answer that is not streamed, e.g. a timing); a failure that
    :func:`stream_error` gives a status of ours raises as that error: an image that does not
    decode is a 422, memory that ran out a 507, never a 500."""
    try:
        return work(*args, **kwargs)
    except HapiCoreError:
        raise
    except Exception as exc:
        status, detail = stream_error(exc)
        for known in (InvalidShardError, InsufficientMemoryError):
            if status == known.status:
                raise known(detail) from exc
        raise


def validation_detail(errors: Sequence[Mapping[str, Any]]) -> str:
    """The ``detail`` of a 422 for a request that fails its schema: the first five problems."""
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors[:5]]
    return "; ".join(parts) or "invalid request"
