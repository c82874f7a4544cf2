"""``hapi``: a Swift proxy filter that serves HAPI feature extraction under Swift's own auth.

A HAPI request is a ``POST`` to the shard's object URL with ``X-Hapi-Request: extract`` (or the
content type ``application/x-hapi-request+json``) and the ``ExtractRequest`` JSON as its body
(``container`` and ``shard`` may be left out: the URL names them); ``X-Hapi-Request: timings``
with a ``TimingsRequest`` asks for the measured costs of a model's head over the shard's first
images instead (what the client's ``split="auto"`` needs). The filter

1. checks the envelope (method, object URL, body size, a JSON object at most
   ``MAX_JSON_DEPTH`` deep whose names match the URL) and answers 4xx with a JSON
   ``{"detail", "code"}`` body when it is malformed; a ``.`` or ``..`` segment in the
   account, container, object or weights names is a 422 ``invalid_name`` before anything is
   authorised (URL handling would resolve it to another object than the one authorised);
2. authorises a read of the object *as the caller*: a HEAD subrequest through the rest of the
   pipeline, so tempauth or keystone and the container ACLs decide; their 401/403/404 is
   passed on;
3. runs the request: ``execution = decoupled`` forwards it with the caller's token to one of
   ``hapi_servers`` (round-robin, skipping those whose ``/healthz`` failed) and streams the
   answer back as it arrives (503 when none is up); ``execution = in_proxy`` runs the
   extraction or the timing in this process's thread pool (see :mod:`swift_middleware.in_proxy`).

Every other request passes through untouched. The filter never forwards a HAPI request down
the pipeline, so it never writes object metadata (an object POST would replace all of it).
``/info`` lists it under ``hapi``.

Put it after the auth filter::

    [pipeline:main]
    pipeline = catch_errors gatekeeper healthcheck proxy-logging cache listing_formats
               tempauth hapi copy dlo slo proxy-logging proxy-server

    [filter:hapi]
    use = egg:hapi#hapi

Every option is checked at proxy start: a bad value stops the proxy with a ``FilterConfigError``
naming the option. The tables below write out the declaration of :mod:`swift_middleware.config`
(``tests/swift_middleware/test_mw_config.py`` keeps them equal to it).

.. options-table:start

The filter's own options:

==========================  ===========  ===========================================================
Option                      Default      Meaning
==========================  ===========  ===========================================================
execution                   decoupled    ``decoupled`` (HAPI servers) or ``in_proxy``
hapi_servers                (none)       HAPI server base URLs, comma or space separated (required
                                         with execution = decoupled)
swift_url                   (none)       this Swift's base URL as the HAPI servers reach it; sent to
                                         them as ``X-Storage-Url`` + ``/v1/<account>`` (default: the
                                         request's URL)
max_body_bytes              1 MiB        largest HAPI request body
health_check_interval       5            seconds a ``/healthz`` result is trusted
health_timeout              2            seconds for one ``/healthz`` check
conn_timeout                5            seconds to connect to a HAPI server
node_timeout                600          seconds to wait for each read from a HAPI server
device                      auto         in_proxy: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``
send_timeout                60           in_proxy: a client that takes no frame for this long is cut
                                         off (its slot and memory freed; the server's
                                         ``HAPI_SEND_TIMEOUT_S``)
==========================  ===========  ===========================================================

The in-proxy options: the extraction core's settings (:class:`hapi_core.CoreSettings`),
with its checks and meanings, under these names:

==========================  ===========  ===========================================================
Option                      Default      Meaning
==========================  ===========  ===========================================================
adaptation                  true         off: every request runs at its b_max, unchecked
b_min                       25           smallest COS batch the adaptation hands out
adaptation_window_s         0.005        how long a round waits to gather requests arriving together
memory_budget_bytes         2 GiB *      M_total of the cpu device (a GPU's comes from NVML) (the
                                         core's ``cpu_memory_budget_bytes``)
gpu_memory_limit_bytes      (none)       cap a GPU's usable memory (testing)
count_process_memory        true         on a CPU, count the process's resident memory beyond the
                                         reserve, the planned requests and the resident weights as
                                         occupied (off: plan the budget alone)
memory_sample_interval_s    0.01         how often the process's resident memory is sampled
framework_reserve_bytes     256 MiB      memory per device never planned (framework, allocator)
max_concurrent              2 *          worker threads per device (image checks, decode and
                                         compute) (the core's ``max_concurrent_per_device``)
torch_threads               (none)       torch intra-op threads; default: the cores decode leaves
cpu_forwards_at_once        (none)       head forward passes a CPU device runs at once, the others
                                         waiting their turn (the least recently served caller's
                                         oldest request next); default: the cores over torch's
                                         threads (1 when torch has them all: more only time-slice
                                         the cores)
cores                       (none)       cores the decode threads and torch's intra-op threads share
                                         (their sum never exceeds it); default: the cores this
                                         process may run on (its affinity)
decode_threads              (none)       threads that decode the next COS batch of every request
                                         while the head runs (one FIFO pool); default: all cores but
                                         one with a GPU, one per 8 cores on a CPU (the head needs
                                         them); 0: each request decodes in its own thread, with no
                                         overlap
decode_path                 fast         fast: libjpeg-turbo into uint8 and batched normalisation;
                                         pil: the previous PIL path (for the roofline benchmark's
                                         comparison)
channels_last               true         run each head on a channels_last input where that measured
                                         faster (once per architecture, split, input shape and
                                         device)
fold_batch_norms            true         fold each batch norm that follows a convolution into it, in
                                         the heads this host runs (once per layer; features equal to
                                         float rounding)
allow_tf32                  false        let a GPU run float32 convolutions and matmuls in TF32
                                         (faster, ~1e-3 relative error): off, a float32 request gets
                                         float32 features that the client's own layers reproduce to
                                         float32 rounding
max_object_bytes            1 GiB        largest shard object (413)
max_weights_bytes           2 GiB        largest weights object (413)
max_image_pixels            40000000     largest image, width x height (413)
max_samples_per_request     10000        most samples in one shard (413)
max_image_bytes             16 MiB       largest image object or tar member, in place (413/422)
object_read_concurrency     16           image objects of a folder dataset's part one request reads
                                         at once
queue_limit                 64 *         waiting requests per device before 503
request_timeout             600          longest wait for memory before 504 (the core's
                                         ``request_timeout_s``)
retry_after                 5 *          Retry-After of a 503 (queue full) (the core's
                                         ``retry_after_s``)
weights_cache_bytes         1 GiB *      idle weights kept loaded
feature_store_bytes         0 *          computed features kept for other requests of the same
                                         shard, weights, split, transform and dtype (least recently
                                         used evicted), and the most that computations in flight
                                         copy for them; 0: no store and no coalescing of concurrent
                                         identical requests
feature_store_dir           (none)       keep the store's features as files in this directory
                                         instead of memory; one that cannot be written turns the
                                         store off (logged once)
==========================  ===========  ===========================================================

Defaults marked * differ from the HAPI server's:

- ``memory_budget_bytes`` 2 GiB (server: 4 GiB): the proxy's memory also serves every plain Swift
  request, and each proxy worker plans a budget of its own.
- ``max_concurrent`` 2 (server: 8): extractions share the proxy worker's cores with its routing of
  all other traffic.
- ``queue_limit`` 64 (server: 256): each waiting request holds a proxy connection; a busy proxy
  answers 503 sooner.
- ``retry_after`` 5 (server: 2): also the Retry-After when no HAPI server is up (decoupled), which
  is not checked again before health_check_interval (5 s).
- ``weights_cache_bytes`` 1 GiB (server: 2 GiB): idle models stay in every proxy worker's memory
  beside Swift's own.
- ``feature_store_bytes`` 0 (server: 256 MiB): each proxy worker would keep a store of its own;
  decoupled execution already shares through the HAPI server's store.

.. options-table:end
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

from swift.common.registry import register_swift_info
from swift.common.swob import Request, Response
from swift.common.utils import get_logger

from hapi_contract import (
    CONTENT_TYPE_FRAMES,
    CONTENT_TYPE_HAPI_REQUEST,
    EXTRACT_PATH,
    HEADER_AUTH_TOKEN,
    HEADER_EXECUTION,
    HEADER_HAPI_REQUEST,
    HEADER_PIPELINE,
    HEADER_PIPELINE_SEQ,
    HEADER_STORAGE_URL,
    TIMINGS_PATH,
)
from hapi_core.errors import HapiCoreError
from swift_middleware.config import Execution, FilterConfig
from swift_middleware.errors import HapiResponseError
from swift_middleware.hapi_request import (
    OPERATIONS,
    HapiRequest,
    is_hapi_request,
    parse_hapi_request,
)
from swift_middleware.in_proxy import InProxyExtractor
from swift_middleware.swift_access import Logger, WsgiApp, authorize_read
from swift_middleware.upstream import ServerPool, forward

__all__ = ["HapiMiddleware", "filter_factory", "json_error"]

LOG_ROUTE = "hapi"
"""The filter's route in the proxy's logging (``get_logger``'s ``log_route``)."""


def json_error(exc: HapiResponseError | HapiCoreError) -> Response:
    """The response for ``exc``: its status and headers, body ``{"detail": ..., "code": ...}``."""
    body = json.dumps({"detail": exc.detail, "code": exc.code}).encode()
    return Response(
        status=exc.status, body=body, content_type="application/json", headers=exc.headers
    )


class HapiMiddleware:
    """The WSGI filter; see the module docstring. ``app`` is the rest of the proxy pipeline."""

    def __init__(
        self, app: WsgiApp, config: FilterConfig, conf: Mapping[str, Any] | None = None
    ) -> None:
        """``conf``: the merged paste options, for Swift's logger (``log_name``, ``log_level``,
        ``log_facility``...), so the filter logs where the proxy does, with transaction ids."""
        self.app = app
        self.config = config
        self.logger: Logger = get_logger(dict(conf or {}), log_route=LOG_ROUTE)
        self.pool: ServerPool | None = None
        self.in_proxy: InProxyExtractor | None = None
        if config.execution is Execution.IN_PROXY:
            self.in_proxy = InProxyExtractor(config, app, self.logger)
        else:
            self.pool = ServerPool(
                config.hapi_servers,
                interval=config.health_check_interval,
                timeout=config.health_timeout,
                logger=self.logger,
            )

    def __call__(self, env: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        req = Request(env)
        if not is_hapi_request(req):
            return self.app(env, start_response)
        try:
            resp = self.handle(req)
        except (HapiResponseError, HapiCoreError) as exc:
            self.logger.info(
                "HAPI request %s %s refused: %s %s", req.method, req.path, exc.status, exc.detail
            )
            resp = json_error(exc)
        return resp(env, start_response)

    def handle(self, req: Request) -> Response:
        """Check, authorise and run one HAPI request; HapiResponseError for a refusal."""
        hapi = parse_hapi_request(req, self.config.max_body_bytes)
        authorize_read(req.environ, self.app, hapi.object_path, f"{hapi.container}/{hapi.obj}")
        if self.in_proxy is not None:
            try:
                return self.in_proxy.handle(req, hapi)
            except HapiCoreError as exc:
                # As a decoupled refusal carries it: which execution answered.
                exc.headers.setdefault(HEADER_EXECUTION, Execution.IN_PROXY.value)
                raise
        return self._forward(req, hapi)

    def _forward(self, req: Request, hapi: HapiRequest) -> Response:
        assert self.pool is not None
        base = self.config.swift_url or req.host_url
        timings = hapi.operation == "timings"
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json" if timings else f"{CONTENT_TYPE_FRAMES}, application/json",
            HEADER_STORAGE_URL: f"{base}/v1/{quote(hapi.account, safe='')}",
        }
        token = req.headers.get(HEADER_AUTH_TOKEN) or req.headers.get("X-Storage-Token")
        if token:
            headers[HEADER_AUTH_TOKEN] = token
        trans_id = req.environ.get("swift.trans_id")
        if trans_id:
            headers["X-Trans-Id"] = str(trans_id)
        if not timings:
            for name in (HEADER_PIPELINE, HEADER_PIPELINE_SEQ):
                if value := req.headers.get(name):
                    headers[name] = value
        upstream = forward(
            self.pool,
            hapi.body_bytes(),
            headers,
            conn_timeout=self.config.conn_timeout,
            node_timeout=self.config.node_timeout,
            retry_after=self.config.retry_after,
            path=TIMINGS_PATH if timings else EXTRACT_PATH,
        )
        self.logger.debug("HAPI %s -> %s: %d", req.path, upstream.server, upstream.status)
        # eventlet.wsgi buffers writes below 4 KiB; frames should leave as they arrive.
        req.environ["eventlet.minimum_write_chunk_size"] = 0
        return Response(
            status=f"{upstream.status} {upstream.reason}",
            headers=[*upstream.headers, (HEADER_EXECUTION, Execution.DECOUPLED.value)],
            app_iter=upstream.body,
        )


def filter_factory(global_conf: dict[str, Any], **local_conf: Any) -> Callable[[WsgiApp], Any]:
    """Paste entry point (``use = egg:hapi#hapi``); checks the options at proxy start.

    As Swift's own middlewares do, the options are ``global_conf`` with ``local_conf`` over it.
    """
    conf = {**global_conf, **local_conf}
    config = FilterConfig.from_paste(global_conf, local_conf)
    register_swift_info(
        "hapi",
        execution=config.execution.value,
        operations=list(OPERATIONS),
        request_header=HEADER_HAPI_REQUEST,
        request_content_type=CONTENT_TYPE_HAPI_REQUEST,
        response_content_type=CONTENT_TYPE_FRAMES,
        max_body_bytes=config.max_body_bytes,
    )
    if config.hapi_servers:
        register_swift_info("hapi", admin=True, hapi_servers=config.hapi_servers)

    def hapi_filter(app: WsgiApp) -> HapiMiddleware:
        return HapiMiddleware(app, config, conf)

    return hapi_filter
