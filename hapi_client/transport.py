"""HTTP to the HAPI server (directly or through the Swift proxy's HAPI filter), with retries.

A shard's features count only once its stream ended with a valid end frame and its offsets
cover every sample exactly once; a connection error, a 5xx, a 503 or a truncated stream
(e.g. the server was restarted mid-epoch) makes the whole shard request start again, so a shard
is delivered whole or not at all. Requests are retried on a time budget
(:class:`~hapi_client.retry.RetryPolicy`): a restart of the HAPI server, the Swift proxy, an
object server or memcached (``hapi stack up``) within the budget costs a pause, not the run.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
import torch

from hapi_contract import (
    API_PREFIX,
    HEADER_METRICS,
    HEADER_PIPELINE,
    HEADER_PIPELINE_SEQ,
    ExtractRequest,
    FinetuneMetrics,
    FinetuneRequest,
    FrameError,
    RemoteStreamError,
    TimingsRequest,
    TimingsResponse,
)
from hapi_contract.frames import BatchFrame, EndFrame, FrameDecoder

from .bandwidth import BandwidthEstimator, StreamClock
from .errors import ConfigurationError, DeliveryError, ServerError, ServerUnavailableError
from .retry import Outage, RetryClock, RetryPolicy, failure_kind
from .swift_session import SwiftSession
from .throttle import TokenBucket

log = logging.getLogger(__name__)

__all__ = ["HAPI_REQUEST_HEADER", "RETRY_STATUSES", "HapiTransport", "RetryPolicy", "ShardFeatures"]

RETRY_STATUSES = {500, 502, 503, 504}
HAPI_REQUEST_HEADER = "X-Hapi-Request"
#: What the Swift proxy's HAPI filter serves (``X-Hapi-Request``); the rest goes to the server.
_FILTER_OPERATIONS = ("extract", "timings")

_T = TypeVar("_T")


@dataclass
class ShardFeatures:
    features: torch.Tensor
    labels: torch.Tensor
    end: EndFrame
    wire_bytes: int
    seconds: float
    attempts: int = 1
    cos_batch_sizes: list[int] = field(default_factory=list)


_KIND_TEXT = {"refused": "refused", "timeout": "timed out", "cut": "cut mid-stream"}


def _transport_kind(exc: httpx.TransportError) -> str:
    """``refused``, ``timeout``, ``cut`` or ``other`` for an httpx failure."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return "cut"
    return failure_kind(exc)


def _detail(resp: httpx.Response) -> tuple[str, str]:
    try:
        body = resp.json()
        return str(body.get("detail", resp.text)), str(body.get("code", ""))
    except (json.JSONDecodeError, ValueError, AttributeError):
        return resp.text[:500] or resp.reason_phrase, ""


class HapiTransport:
    def __init__(
        self,
        endpoint: str,
        swift: SwiftSession,
        *,
        via: Literal["hapi", "swift"] = "hapi",
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        bandwidth: BandwidthEstimator | None = None,
        throttle: TokenBucket | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.throttle = throttle
        self.swift = swift
        self.via = via
        self.retry = retry or RetryPolicy()
        self.bandwidth = bandwidth
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))
        self._filter_ops: tuple[str, ...] | None = None
        #: The server's (or the filter's) current outage, shared by every request of this
        #: transport: a request started during one gets only what is left of its budget.
        self.outage = Outage()
        #: This client's extractions are one pipeline: the server sends their responses in the
        #: order they were asked for (``HEADER_PIPELINE``), what the client consumes next first.
        self.pipeline = uuid.uuid4().hex
        #: Each extraction's place in the pipeline (``HEADER_PIPELINE_SEQ``), taken when it is
        #: asked for, before its connection races the others' to the server; a retry keeps it.
        self._asked = itertools.count()

    def close(self) -> None:
        self._http.close()

    def _target(
        self, container: str, obj: str, what: str, clock: RetryClock
    ) -> tuple[str, dict[str, str]]:
        storage_url, token = self.swift.auth(clock=clock)
        headers = {"X-Auth-Token": token, "X-Storage-Url": storage_url}
        # Swift's HAPI filter serves extraction and timings; ALL_IN_COS fine-tuning goes to the
        # server itself.
        if self.via == "swift" and what in _FILTER_OPERATIONS:
            # Through the proxy's HAPI filter: the object URL of the shard, marked as a HAPI call.
            self.check_filter(storage_url, what)
            headers[HAPI_REQUEST_HEADER] = what
            return f"{storage_url}/{quote(container, safe='')}/{quote(obj, safe='/')}", headers
        return f"{self.endpoint}{API_PREFIX}/{what}", headers

    def check_filter(self, storage_url: str, what: str) -> None:
        """Refuse ``what`` through a proxy whose ``/info`` does not list it.

        Without the filter, a POST to an object is Swift's own metadata update: it answers 202
        and drops the shard's metadata. A proxy that hides ``/info`` cannot be checked; its
        answer then says what it is.
        """
        base = storage_url.split("/v1/", 1)[0]
        ops = self._filter_operations(base)
        if ops is None or what in ops:
            return
        if not ops:
            raise ConfigurationError(
                f"the Swift proxy at {base} has no HAPI filter (its /info lists none): "
                'via="swift" needs `use = egg:hapi#hapi` in its pipeline; or use via="hapi"'
            )
        raise ConfigurationError(
            f"the HAPI filter of the Swift proxy at {base} serves {', '.join(ops)}, not {what}: "
            "it is older than this client"
        )

    def _filter_operations(self, base: str) -> tuple[str, ...] | None:
        """The operations the HAPI filter of the proxy at ``base`` advertises (``()``: no filter),
        read once from its ``/info``; None when that cannot be read (hidden, or down now)."""
        if self._filter_ops is not None:
            return self._filter_ops
        try:
            resp = self._http.get(f"{base}/info", timeout=10.0)
            info = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            log.debug("cannot read %s/info: %r", base, exc)
            return None
        if not isinstance(info, dict):
            log.warning("%s/info is not readable: cannot check for the HAPI filter", base)
            return None
        hapi = info.get("hapi")
        ops = hapi.get("operations", ("extract",)) if isinstance(hapi, dict) else ()
        self._filter_ops = tuple(str(op) for op in ops)
        return self._filter_ops

    def _unavailable(
        self,
        label: str,
        clock: RetryClock,
        last: str,
        status: int | None,
        code: str,
        kind: str,
    ) -> ServerUnavailableError:
        where = self.endpoint if self.via == "hapi" else "the Swift proxy's HAPI filter"
        if code == "swift_unavailable":
            # The server runs but cannot read Swift: the proxy or a storage server is down.
            hint = (
                "the Swift proxy or an object server behind the HAPI server is likely down: "
                "run `hapi stack up`"
            )
        elif status is not None:
            hint = f"the server answered {status}: see its log"
        elif kind == "refused":
            url = self.endpoint if self.via == "hapi" else "the Swift proxy"
            hint = f"nothing listens at {url}: is the stack up? run `hapi stack up`"
        elif kind == "cut":
            hint = (
                "the connection was cut mid-stream (the server restarted, or something between "
                "closes long responses); if it keeps happening, see the server's log"
            )
        elif kind == "timeout":
            hint = "the server did not answer within the timeout: is it overloaded or hung?"
        else:
            hint = "is the stack up? run `hapi stack up`"
        return ServerUnavailableError(
            f"{label} via {where} failed ({clock.summary()}, retry budget "
            f"{self.retry.budget_s:g} s): {last}; {hint}",
            status=status,
            code=code,
        )

    def _request(
        self,
        label: str,
        container: str,
        obj: str,
        what: str,
        send: Callable[[str, dict[str, str]], _T | httpx.Response],
    ) -> tuple[_T, int]:
        """``send(url, headers)`` until it returns a result; also returns the attempts made.

        ``send`` returns a non-200 response as is and raises for a broken connection or stream.
        Failures that can pass are retried until the budget is spent, then ServerUnavailableError;
        a 4xx is final (ServerError), except one 401 per request, which renews the token first.
        """
        # The server's outage; a login this request needs runs on the auth endpoint's own outage
        # (SwiftSession.auth), with this clock as its parent: an extraction that succeeds
        # meanwhile neither ends the login's outage nor gives a later login a fresh budget.
        clock = self.retry.clock(label, self.outage)
        refreshed = False
        attempts = 0
        while True:
            url, headers = self._target(container, obj, what, clock)
            attempts += 1
            retry_after: str | None = None
            status: int | None = None
            code = ""
            kind = "other"
            clock.attempt()
            try:
                result = send(url, headers)
            except httpx.TransportError as exc:
                kind = _transport_kind(exc)
                last = f"connection error ({_KIND_TEXT.get(kind, type(exc).__name__)}): {exc}"
            except RemoteStreamError as exc:
                if exc.status < 500:
                    raise ServerError(exc.status, exc.detail) from exc
                last, status = f"the stream ended with {exc.status}: {exc.detail}", exc.status
            except (FrameError, DeliveryError) as exc:
                last, kind = f"the stream broke: {exc}", "cut"
            else:
                if not isinstance(result, httpx.Response):
                    clock.succeeded()
                    return result, attempts
                detail, code = _detail(result)
                status = result.status_code
                if status == 401 and not refreshed:
                    # Tokens live in memcached: a restarted one forgot them all. Log in again.
                    refreshed = True
                    self.swift.auth(refresh=True, stale_token=headers["X-Auth-Token"], clock=clock)
                    continue
                if status not in RETRY_STATUSES:
                    raise ServerError(status, detail, code)
                last = f"{status} {code or 'error'}: {detail}"
                retry_after = result.headers.get("retry-after")
            if not clock.wait(last, retry_after):
                raise self._unavailable(label, clock, last, status, code, kind)

    def extract(self, req: ExtractRequest, num_samples: int | None = None) -> ShardFeatures:
        body = req.model_dump(mode="json")
        order = {HEADER_PIPELINE: self.pipeline, HEADER_PIPELINE_SEQ: str(next(self._asked))}
        result, attempts = self._request(
            f"extracting {req.container}/{req.shard}",
            req.container,
            req.shard,
            "extract",
            lambda url, headers: self._extract_once(url, {**headers, **order}, body),
        )
        if num_samples is not None and result.end.samples != num_samples:
            raise DeliveryError(
                f"{req.shard}: the server sent {result.end.samples} samples, "
                f"the manifest says {num_samples}"
            )
        result.attempts = attempts
        return result

    def _extract_once(
        self, url: str, headers: dict[str, str], body: dict[str, Any]
    ) -> ShardFeatures | httpx.Response:
        decoder = FrameDecoder()
        frames: list[BatchFrame] = []
        start = time.perf_counter()
        wire = 0
        link = StreamClock()  # the link's time only, not the server's between its batches
        with self._http.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                resp.read()
                return resp
            for chunk in resp.iter_bytes():
                if self.throttle is not None:
                    self.throttle.consume(len(chunk))
                link.chunk(len(chunk), continues=decoder.inside_frame)
                wire += len(chunk)
                frames += [f for f in decoder.feed(chunk) if isinstance(f, BatchFrame)]
        end = decoder.close()
        done = time.perf_counter()
        link.report(self.bandwidth)
        frames.sort(key=lambda f: f.offset)
        expected = 0
        for f in frames:
            if f.offset != expected:
                raise DeliveryError(
                    f"samples {expected}..{f.offset - 1} missing or duplicated in the stream"
                )
            expected += f.count
        if expected != end.samples:
            raise DeliveryError(
                f"stream carried {expected} samples, its end frame says {end.samples}"
            )
        features = torch.cat([f.features for f in frames]) if frames else torch.empty(0)
        labels = (
            torch.cat([f.labels for f in frames]) if frames else torch.empty(0, dtype=torch.int64)
        )
        return ShardFeatures(
            features,
            labels,
            end,
            wire,
            done - start,
            cos_batch_sizes=list(end.meta.get("cos_batch_sizes", [])) if end.meta else [],
        )

    def timings(self, req: TimingsRequest) -> TimingsResponse:
        """The server's measured costs of ``req``'s head (``POST /v1/timings``, or the Swift
        filter's ``timings`` operation with ``via="swift"``, which a decoupled filter forwards to
        a HAPI server and an in-proxy one measures itself)."""
        body = req.model_dump(mode="json")

        def send(url: str, headers: dict[str, str]) -> TimingsResponse | httpx.Response:
            resp = self._http.post(url, json=body, headers=headers)
            if resp.status_code != 200:
                return resp
            return TimingsResponse.model_validate_json(resp.content)

        result, _ = self._request(
            f"timing {req.model.arch} on {req.container}/{req.shard}",
            req.container,
            req.shard,
            "timings",
            send,
        )
        return result

    def finetune(self, req: FinetuneRequest) -> tuple[bytes, FinetuneMetrics]:
        body = req.model_dump(mode="json")

        def send(
            url: str, headers: dict[str, str]
        ) -> tuple[bytes, FinetuneMetrics] | httpx.Response:
            resp = self._http.post(url, json=body, headers=headers)
            if resp.status_code != 200:
                return resp
            return resp.content, FinetuneMetrics.model_validate_json(resp.headers[HEADER_METRICS])

        result, _ = self._request(
            f"fine-tuning on {req.container}", req.container, req.shards[0], "finetune", send
        )
        return result
