"""What each route can answer, declared for the OpenAPI document: every status, its real body.

Every refusal is the contract's ``ErrorBody`` as ``application/json``, whatever the route's
success media type is. FastAPI files an extra response's ``model`` under the *route's* media
type, so the routes with a non-JSON success (frames, safetensors, Prometheus text) use a response
class without one and declare their 200 content here explicitly.

:func:`install_openapi` adds what only this server knows to the request schemas, which the
contract keeps torch- and settings-free: the architectures (an enum from the model registry),
that the endpoints require ``model.weights``, the epochs limit of ``/v1/finetune``, and the
request body limit (``x-max-body-bytes`` on every request body and at the top, beside the 413).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hapi_contract import CONTENT_TYPE_FRAMES, ErrorBody, Health

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .settings import ServerSettings

__all__ = [
    "BODY_LIMIT_EXTENSION",
    "extract_responses",
    "finetune_responses",
    "health_responses",
    "install_openapi",
    "metrics_responses",
    "models_responses",
]

#: The OpenAPI extension that states the largest request body, in bytes (413 over it).
BODY_LIMIT_EXTENSION = "x-max-body-bytes"

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
        "are not safetensors for the architecture, `crop` over `resize`, a crop too small for "
        "the architecture (alexnet needs 63, VGG 32), a profile whose lists "
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


def install_openapi(app: FastAPI, settings: ServerSettings) -> None:
    """Make ``app.openapi()`` (``/openapi.json``, ``/docs``) state what this server refuses.

    JSON Schema cannot count a body's bytes, so the limit is the ``x-max-body-bytes`` extension
    of every request body (and of the document's ``info``), named in each body's description and
    in every 413; a client keeps its JSON under it, and schema-driven tests expect the 413 over.
    """
    import hapi_models  # the registry: torch is loaded by the server anyway

    plain = app.openapi
    limit = settings.max_request_body_bytes
    archs = hapi_models.list_models()

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = plain()
        doc["info"][BODY_LIMIT_EXTENSION] = limit
        schemas = doc["components"]["schemas"]
        model_ref = schemas["ModelRef"]
        arch = model_ref["properties"]["arch"]
        arch["enum"] = archs
        # timm's names (about a thousand, tags included) are resolved on demand, not listed: the
        # enum holds what is listed, so every name it allows is one the server runs, and the
        # description says that the server takes ``timm/NAME`` beyond it.
        arch["description"] = (
            f"a registry architecture: one of {', '.join(archs)} (`GET /v1/models` describes them); "
            "beyond this list the server also takes a timm model as `timm/NAME` (for example "
            "`timm/convnext_atto`), resolved when first named"
        )
        # The contract lets a client build a ModelRef without weights; these endpoints refuse it.
        weights = model_ref["properties"]["weights"]
        weights.pop("anyOf", None)
        weights["$ref"] = "#/components/schemas/WeightsRef"
        weights.pop("default", None)
        weights["description"] = (
            "the weights to load, required by this server (`hapi upload model` stores them), so "
            "that the server and the client run the same network"
        )
        model_ref["required"] = sorted({*model_ref["required"], "weights"})
        epochs = schemas["FinetuneRequest"]["properties"]["epochs"]
        epochs["maximum"] = min(
            epochs.get("maximum", settings.max_finetune_epochs), settings.max_finetune_epochs
        )
        for ops in doc["paths"].values():
            for op in ops.values():
                body = op.get("requestBody")
                if body is not None:
                    body[BODY_LIMIT_EXTENSION] = limit
                    body["description"] = (
                        f"at most {limit} bytes of JSON (`HAPI_MAX_REQUEST_BODY_BYTES`); 413 over"
                    )
                if "413" in op.get("responses", {}):
                    op["responses"]["413"]["description"] += (
                        f"; this server's request body limit is {limit} bytes "
                        f"(`{BODY_LIMIT_EXTENSION}`)"
                    )
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
