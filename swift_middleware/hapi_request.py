"""Recognising a HAPI request among Swift requests, and checking it before anything is read.

A HAPI request is a ``POST`` to an object URL ``/v1/<account>/<container>/<object>`` (the object
is the shard) that carries ``X-Hapi-Request: extract`` or ``X-Hapi-Request: timings``, or the
content type ``application/x-hapi-request+json`` (which implies ``extract``). The body is the
JSON ``ExtractRequest`` of ``POST /v1/extract`` (or the ``TimingsRequest`` of
``POST /v1/timings``); ``container`` and ``shard`` may be left out (they come from the URL) and,
when present, must name the same object as the URL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from swift.common.swob import Request, wsgi_to_str

from hapi_contract import CONTENT_TYPE_HAPI_REQUEST, HEADER_HAPI_REQUEST, has_dot_segment
from swift_middleware.errors import BadHapiRequestError

__all__ = [
    "CONTENT_TYPE_HAPI_REQUEST",
    "HEADER_HAPI_REQUEST",
    "MAX_JSON_DEPTH",
    "OPERATIONS",
    "HapiRequest",
    "check_swift_names",
    "is_hapi_request",
    "object_path",
    "parse_hapi_request",
]

_BODY_SCHEMA = {"extract": "ExtractRequest", "timings": "TimingsRequest"}

OPERATIONS = tuple(_BODY_SCHEMA)
"""The operations the filter serves: a shard's features, or the measured costs of a model's head
over its first images (what ``split="auto"`` asks before it chooses a split)."""

_JSON_TYPES = ("application/json", CONTENT_TYPE_HAPI_REQUEST)

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a HAPI request body may have (a real one has 4)."""


def object_path(account: str, container: str, obj: str) -> str:
    """The quoted Swift path ``/v1/<account>/<container>/<object>`` (names as real strings)."""
    return f"/v1/{quote(account, safe='')}/{quote(container, safe='')}/{quote(obj, safe='/')}"


def _media_type(req: Request) -> str:
    return str(req.headers.get("Content-Type", "")).split(";", 1)[0].strip().lower()


def is_hapi_request(req: Request) -> bool:
    """True if the request asks for HAPI, whatever else is wrong with it.

    The header marks a HAPI request on any method and URL (a GET with it is refused, not
    served as a plain GET). The content type only counts on a POST to an object URL: a PUT may
    store such a document, and Swift takes a POST to an account or a container as a metadata
    update whatever its content type, so those pass through untouched.
    """
    if HEADER_HAPI_REQUEST in req.headers:
        return True
    if req.method != "POST" or _media_type(req) != CONTENT_TYPE_HAPI_REQUEST:
        return False
    try:
        req.split_path(4, 4, True)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HapiRequest:
    """A checked HAPI request: where the shard is and the JSON body to run."""

    operation: str
    account: str
    container: str
    obj: str
    body: dict[str, Any] = field(repr=False)

    @property
    def object_path(self) -> str:
        """The quoted Swift path of the shard, ``/v1/<account>/<container>/<object>``."""
        return object_path(self.account, self.container, self.obj)

    def body_bytes(self) -> bytes:
        """The body as sent to a HAPI server (``container`` and ``shard`` filled in)."""
        return json.dumps(self.body, separators=(",", ":")).encode()


def _read_body(req: Request, limit: int) -> bytes:
    length = req.headers.get("Content-Length")
    if length is not None:
        if not length.isdigit():
            raise BadHapiRequestError(f"bad Content-Length {length!r}")
        if int(length) > limit:
            raise BadHapiRequestError(
                f"HAPI request body is {int(length)} bytes, over the limit of {limit} bytes",
                status=413,
                code="too_large",
            )
    elif req.headers.get("Transfer-Encoding", "").lower() != "chunked":
        raise BadHapiRequestError(
            "a HAPI request needs a Content-Length (or chunked transfer encoding)",
            status=411,
            code="length_required",
        )
    data: bytes = req.environ["wsgi.input"].read(limit + 1)
    if len(data) > limit:
        raise BadHapiRequestError(
            f"HAPI request body is over the limit of {limit} bytes", status=413, code="too_large"
        )
    return data


def _json_depth(value: Any) -> int:
    """How deeply ``value`` nests arrays and objects; iterative, so any depth is measured."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _parse_json(raw: bytes) -> Any:
    try:
        body = json.loads(raw)
    except RecursionError:
        # The decoder recurses per level: a deep enough body exhausts the stack.
        raise BadHapiRequestError(
            f"HAPI request body nests deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        # ValueError covers JSONDecodeError and Python's limit on digits in one integer.
        raise BadHapiRequestError(f"HAPI request body is not JSON: {exc}") from None
    if _json_depth(body) > MAX_JSON_DEPTH:
        # Refused here rather than wherever the body is walked next (re-encoding, validation).
        raise BadHapiRequestError(f"HAPI request body nests deeper than {MAX_JSON_DEPTH} levels")
    return body


def check_swift_names(**names: str) -> None:
    """Refuse a ``.`` or ``..`` path segment in any of ``names`` (422, code ``invalid_name``).

    Such a segment makes "the object that is authorised" and "the object that is read"
    differ: URL handling resolves ``c/a/../b`` to ``c/b`` wherever it happens (an HTTP client,
    the HAPI server's Swift reader), while Swift's ACL check ran on the name as written.
    """
    for what, value in names.items():
        if has_dot_segment(value):
            raise BadHapiRequestError(
                f"{what} name {value!r} has a '.' or '..' path segment; such names are refused "
                "because a URL holding them can name another object",
                status=422,
                code="invalid_name",
            )


def _check_weights_names(body: dict[str, Any]) -> None:
    model = body.get("model")
    weights = model.get("weights") if isinstance(model, dict) else None
    if not isinstance(weights, dict):
        return  # absent or malformed: the schema check of whoever runs the request says so
    names = {k: weights[k] for k in ("container", "object") if isinstance(weights.get(k), str)}
    check_swift_names(**{f"weights {k}": v for k, v in names.items()})


def _check_name(body: dict[str, Any], key: str, expected: str) -> None:
    if key in body and body[key] != expected:
        raise BadHapiRequestError(
            f"body {key!r} is {body[key]!r} but the URL names {expected!r}; "
            "leave it out or make it match the URL",
            code="path_mismatch",
        )


def parse_hapi_request(req: Request, max_body_bytes: int) -> HapiRequest:
    """Check a request :func:`is_hapi_request` matched; BadHapiRequestError when malformed.

    Reads the body (at most ``max_body_bytes``). Only the envelope is checked here (method, URL,
    size, JSON object, names); the schema is checked by whoever runs the request.
    """
    operation = req.headers.get(HEADER_HAPI_REQUEST, "extract").strip().lower()
    if operation not in OPERATIONS:
        raise BadHapiRequestError(
            f"unknown {HEADER_HAPI_REQUEST} {operation!r}; supported: {', '.join(OPERATIONS)}"
        )
    if req.method != "POST":
        raise BadHapiRequestError(
            f"a HAPI request is a POST, not {req.method}",
            status=405,
            code="method_not_allowed",
            headers={"Allow": "POST"},
        )
    try:
        _, account, container, obj = req.split_path(4, 4, True)
    except ValueError:
        raise BadHapiRequestError(
            "a HAPI request goes to an object URL, /v1/<account>/<container>/<object>"
        ) from None
    if "Range" in req.headers:
        raise BadHapiRequestError("Range cannot be combined with a HAPI request")
    media = _media_type(req)
    if media and media not in _JSON_TYPES:
        raise BadHapiRequestError(
            f"HAPI request bodies are JSON ({' or '.join(_JSON_TYPES)}), not {media}",
            status=415,
            code="unsupported_media_type",
        )
    # Swift hands paths over as WSGI strings (UTF-8 bytes in a latin-1 str).
    account, container, obj = (wsgi_to_str(p) for p in (account, container, obj))
    # Before the body is read and before anything is authorised: nothing is read for a name
    # that could resolve to another object.
    check_swift_names(account=account, container=container, object=obj)
    raw = _read_body(req, max_body_bytes)
    if not raw.strip():
        raise BadHapiRequestError(
            f"empty HAPI request body; send the {_BODY_SCHEMA[operation]} JSON"
        )
    body = _parse_json(raw)
    if not isinstance(body, dict):
        raise BadHapiRequestError(
            f"HAPI request body must be a JSON object, got {type(body).__name__}"
        )
    _check_name(body, "container", container)
    _check_name(body, "shard", obj)
    _check_weights_names(body)
    body = {**body, "container": container, "shard": obj}
    return HapiRequest(operation, account, container, obj, body)
