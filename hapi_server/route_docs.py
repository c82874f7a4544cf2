"""What each route can answer, declared for the OpenAPI document: every status, its real body.

Every refusal is the contract's ``ErrorBody`` as ``application/json``, whatever the route's
success media type is. FastAPI files an extra response's ``model`` under the *route's* media
type, so the routes with a non-JSON success (frames, safetensors, Prometheus text) use a response
class without one and declare their 200 content here explicitly.
"""

from __future__ import annotations

from typing import Any

from hapi_contract import CONTENT_TYPE_FRAMES, ErrorBody, Health

__all__ = [
    "extract_responses",
    "finetune_responses",
    "health_responses",
    "metrics_responses",
    "models_responses",
]

_BINARY = {"schema": {"type": "string", "format": "binary"}}
_HEADER = {"schema": {"type": "string"}}

# Any route: the body limit is enforced before routing, and an unexpected error still answers.
_ANY_ROUTE: dict[int | str, str] = {
    413: "request body over `HAPI_MAX_REQUEST_BODY_BYTES` (`too_large`)",
    500: "an unexpected server error (`internal_error`), logged with its trace",
}

# Routes that read the caller's shard and weights from Swift and plan memory for the work.
_SWIFT_WORK: dict[int | str, str] = {
    400: "the body cannot be parsed at all, e.g. it is not UTF-8 (`bad_request`)",
    401: "no `X-Auth-Token`, or Swift refused the token (`unauthorized`)",
    403: "Swift says the caller may not read the shard or the weights (`forbidden`)",
    404: "the container, shard or weights object does not exist (`not_found`)",
    409: "the weights object is not the blob the request names by sha256 (`sha256_mismatch`)",
    413: (
        "over a server limit (`too_large`): request body, object or weights bytes, image "
        "pixels, samples per request"
    ),
    422: (
        "the request is invalid (`invalid_request`, with an `errors` list for schema errors; "
        "`invalid_name`; `invalid_shard`). Besides the schema: an unknown architecture, a "
        "split/freeze index past the architecture's layers, no `model.weights`, weights that "
        "are not safetensors for the architecture, `crop` over `resize`, a profile whose lists "
        "differ in length, no or a foreign `X-Storage-Url`; a shard that is not a valid tar of "
        "decodable images"
    ),
    "4XX": "another 4xx from Swift for the caller's read, passed on (`swift_refused`)",
    502: "Swift cannot be reached or answers 5xx (`swift_unavailable`)",
    503: "the device's queue is full (`queue_full`); retry after `Retry-After` seconds",
    504: "no memory became free within `HAPI_REQUEST_TIMEOUT_S` (`timeout`)",
    507: (
        "the request does not fit the device even alone at its smallest COS batch "
        "(`insufficient_memory`)"
    ),
}


def _errors(statuses: dict[int | str, str]) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    merged: dict[int | str, str] = {**_ANY_ROUTE, **statuses}
    for status, description in sorted(merged.items(), key=lambda item: str(item[0])):
        out[status] = {"model": ErrorBody, "description": description}
    if 503 in out:
        out[503]["headers"] = {"Retry-After": {**_HEADER, "description": "seconds to wait"}}
    return out


def _headers(*names: str) -> dict[str, Any]:
    return {name: _HEADER for name in names}


def extract_responses() -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "description": "the framed feature stream (layout: `docs/frames.md`)",
            "content": {CONTENT_TYPE_FRAMES: _BINARY},
            "headers": _headers(
                "X-Hapi-Request-Id", "X-Hapi-Device", "X-Hapi-Cos-Batch-Size", "X-Hapi-Samples"
            ),
        },
        **_errors(_SWIFT_WORK),
    }


def finetune_responses() -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "description": "the trained model's weights (safetensors); the run's `FinetuneMetrics` "
            "in `X-Hapi-Metrics` (JSON)",
            "content": {"application/octet-stream": _BINARY},
            "headers": _headers("X-Hapi-Metrics", "X-Hapi-Sha256"),
        },
        **_errors(_SWIFT_WORK),
    }


def timings_responses() -> dict[int | str, dict[str, Any]]:
    return _errors(_SWIFT_WORK)


def models_responses() -> dict[int | str, dict[str, Any]]:
    return _errors({})


def metrics_responses() -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "description": "Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **_errors({}),
    }


def health_responses() -> dict[int | str, dict[str, Any]]:
    return {
        503: {"model": Health, "description": "degraded: Swift does not answer its healthcheck"},
        **{k: v for k, v in _errors({}).items() if k != 503},
    }
