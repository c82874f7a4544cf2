"""A Swift proxy filter that serves HAPI feature extraction under Swift's own auth and ACLs.

Add it after the auth filter of ``proxy-server.conf``::

    [pipeline:main]
    pipeline = ... tempauth hapi copy dlo slo proxy-logging proxy-server

    [filter:hapi]
    use = egg:hapi#hapi
    hapi_servers = http://127.0.0.1:8090

Then ``POST /v1/AUTH_test/<container>/<shard>`` with ``X-Hapi-Request: extract`` and the
``ExtractRequest`` JSON streams the features back. See :mod:`swift_middleware.middleware` for the
request format and every option. Importing this package does not import torch.
"""

from swift_middleware.config import Execution, FilterConfig
from swift_middleware.errors import (
    BadHapiRequestError,
    FilterConfigError,
    HapiMiddlewareError,
    HapiResponseError,
    NoHapiServerError,
    SwiftDeniedError,
    UpstreamError,
)
from swift_middleware.hapi_request import (
    CONTENT_TYPE_HAPI_REQUEST,
    HEADER_HAPI_REQUEST,
    OPERATIONS,
    HapiRequest,
    is_hapi_request,
    parse_hapi_request,
)
from swift_middleware.middleware import HapiMiddleware, filter_factory, json_error
from swift_middleware.upstream import HapiServer, ServerPool

__all__ = [
    "CONTENT_TYPE_HAPI_REQUEST",
    "HEADER_HAPI_REQUEST",
    "OPERATIONS",
    "BadHapiRequestError",
    "Execution",
    "FilterConfig",
    "FilterConfigError",
    "HapiMiddleware",
    "HapiMiddlewareError",
    "HapiRequest",
    "HapiResponseError",
    "HapiServer",
    "NoHapiServerError",
    "ServerPool",
    "SwiftDeniedError",
    "UpstreamError",
    "filter_factory",
    "is_hapi_request",
    "json_error",
    "parse_hapi_request",
]
