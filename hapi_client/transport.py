"""HTTP to the HAPI server (directly or through the Swift proxy's HAPI filter), with retries.

A shard's features count only once its stream ended with a valid end frame and its offsets
cover every sample exactly once; a connection error, a 5xx, a 503 or a truncated stream
(e.g. the server was restarted mid-epoch) makes the whole shard request start again, so a shard
is delivered whole or not at all.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import httpx
import torch

from hapi_contract import (
    API_PREFIX,
    BatchFrame,
    EndFrame,
    ExtractRequest,
    FinetuneRequest,
    FrameDecoder,
    FrameError,
    RemoteStreamError,
)

from .bandwidth import BandwidthEstimator
from .errors import DeliveryError, ServerError, ServerUnavailableError
from .swift_session import SwiftSession
from .throttle import TokenBucket

log = logging.getLogger(__name__)

RETRY_STATUSES = {500, 502, 503, 504}
HAPI_REQUEST_HEADER = "X-Hapi-Request"


@dataclass
class ShardFeatures:
    features: torch.Tensor
    labels: torch.Tensor
    end: EndFrame
    wire_bytes: int
    seconds: float
    attempts: int = 1
    cos_batch_sizes: list[int] = field(default_factory=list)


@dataclass
class RetryPolicy:
    attempts: int = 8
    backoff_s: float = 0.25
    max_backoff_s: float = 8.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after and retry_after.isdigit():
            return min(float(retry_after), self.max_backoff_s)
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)  # noqa: S311


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

    def close(self) -> None:
        self._http.close()

    def _target(self, container: str, obj: str, what: str) -> tuple[str, dict[str, str]]:
        storage_url, token = self.swift.auth()
        headers = {"X-Auth-Token": token, "X-Storage-Url": storage_url}
        # Swift's HAPI filter serves extraction; ALL_IN_COS fine-tuning goes to the server itself.
        if self.via == "swift" and what == "extract":
            # Through the proxy's HAPI filter: the object URL of the shard, marked as a HAPI call.
            headers[HAPI_REQUEST_HEADER] = what
            return f"{storage_url}/{quote(container, safe='')}/{quote(obj, safe='/')}", headers
        return f"{self.endpoint}{API_PREFIX}/{what}", headers

    def _fail_or_retry(self, resp: httpx.Response, attempt: int, refreshed: list[bool]) -> float:
        """Raise for a final error; return the delay before the next attempt otherwise."""
        detail, code = _detail(resp)
        if resp.status_code == 401 and not refreshed[0]:
            refreshed[0] = True
            self.swift.auth(refresh=True)
            return 0.0
        if resp.status_code in RETRY_STATUSES and attempt + 1 < self.retry.attempts:
            log.warning("HAPI %d (%s), retrying", resp.status_code, detail)
            return self.retry.delay(attempt, resp.headers.get("retry-after"))
        raise ServerError(resp.status_code, detail, code)

    def extract(self, req: ExtractRequest, num_samples: int | None = None) -> ShardFeatures:
        body = req.model_dump(mode="json")
        refreshed = [False]
        last_error: Exception | None = None
        for attempt in range(self.retry.attempts):
            url, headers = self._target(req.container, req.shard, "extract")
            try:
                result = self._extract_once(url, headers, body)
            except httpx.TransportError as exc:
                last_error = exc
                log.warning(
                    "HAPI connection error on %s (attempt %d): %s", req.shard, attempt + 1, exc
                )
                time.sleep(self.retry.delay(attempt))  # back-off between attempts
                continue
            except (FrameError, DeliveryError) as exc:
                if isinstance(exc, RemoteStreamError) and exc.status < 500:
                    raise ServerError(exc.status, exc.detail) from exc
                last_error = exc
                log.warning("HAPI stream of %s broke (attempt %d): %s", req.shard, attempt + 1, exc)
                time.sleep(self.retry.delay(attempt))
                continue
            if isinstance(result, httpx.Response):
                time.sleep(self._fail_or_retry(result, attempt, refreshed))
                continue
            if num_samples is not None and result.end.samples != num_samples:
                raise DeliveryError(
                    f"{req.shard}: the server sent {result.end.samples} samples, the manifest says {num_samples}"
                )
            result.attempts = attempt + 1
            return result
        raise ServerUnavailableError(
            f"HAPI server at {self.endpoint} failed {self.retry.attempts} times for {req.shard}: {last_error}"
        )

    def _extract_once(
        self, url: str, headers: dict[str, str], body: dict[str, Any]
    ) -> ShardFeatures | httpx.Response:
        decoder = FrameDecoder()
        frames: list[BatchFrame] = []
        start = time.perf_counter()
        first: float | None = None
        wire = 0
        with self._http.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                resp.read()
                return resp
            first_len = 0
            for chunk in resp.iter_bytes():
                if self.throttle is not None:
                    self.throttle.consume(len(chunk))
                if first is None:
                    first, first_len = time.perf_counter(), len(chunk)
                wire += len(chunk)
                frames += [f for f in decoder.feed(chunk) if isinstance(f, BatchFrame)]
        end = decoder.close()
        done = time.perf_counter()
        if self.bandwidth is not None and first is not None:
            self.bandwidth.observe(wire - first_len, done - first)
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

    def finetune(self, req: FinetuneRequest) -> tuple[bytes, dict[str, Any]]:
        body = req.model_dump(mode="json")
        refreshed = [False]
        for attempt in range(self.retry.attempts):
            url, headers = self._target(req.container, req.shards[0], "finetune")
            try:
                resp = self._http.post(url, json=body, headers=headers)
            except httpx.TransportError as exc:
                log.warning("HAPI connection error on finetune (attempt %d): %s", attempt + 1, exc)
                time.sleep(self.retry.delay(attempt))
                continue
            if resp.status_code != 200:
                time.sleep(self._fail_or_retry(resp, attempt, refreshed))
                continue
            meta = json.loads(resp.headers.get("x-hapi-metrics", "{}"))
            return resp.content, meta
        raise ServerUnavailableError(
            f"HAPI server at {self.endpoint} kept failing the fine-tuning request"
        )
