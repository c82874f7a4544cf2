"""Helpers shared by the server tests: small shards, requests, error checks, metrics, polling."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import httpx
import numpy as np
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from hapi_contract import ErrorBody
from hapi_contract.frames import BatchFrame, EndFrame, FrameDecoder
from hapi_core.adaptation import DeviceScheduler
from hapi_server.core_host import PreparedExtraction
from hapi_stack import RunningStack

from .conftest import DATA, Dataset, ServerProcess, shard_bytes

TIMEOUT = httpx.Timeout(120.0)


def solid_images(n: int, side: int = 32, seed: int = 0) -> tuple[list[bytes], list[int]]:
    """Small smooth JPEGs (a few hundred bytes each), labels 0..2."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(n):
        colour = rng.integers(0, 255, 3, dtype=np.uint8)
        arr = np.broadcast_to(colour, (side, side, 3)).copy()
        arr[: side // 2] //= 2  # some structure, still tiny
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=80)
        images.append(buf.getvalue())
        labels.append(i % 3)
    return images, labels


def put_object(stack: RunningStack, name: str, data: bytes, container: str = DATA) -> None:
    conn = stack.connection()
    try:
        conn.put_object(container, name, data)
    finally:
        conn.close()


def put_shard(stack: RunningStack, name: str, images: list[bytes], labels: list[int]) -> bytes:
    data = shard_bytes(images, labels)
    put_object(stack, name, data)
    return data


@dataclass
class Extraction:
    frames: list[BatchFrame]
    end: EndFrame
    headers: httpx.Headers

    @property
    def labels(self) -> list[int]:
        return [int(v) for f in self.frames for v in f.labels.tolist()]


def extract(
    server: ServerProcess,
    dataset: Dataset,
    body: dict[str, object],
    client: httpx.Client | None = None,
) -> Extraction:
    """POST /v1/extract and decode the whole stream; fails the test on a non-200 status."""
    decoder = FrameDecoder()
    frames: list[BatchFrame] = []
    requester: Any = client or httpx
    with requester.stream(
        "POST",
        f"{server.url}/v1/extract",
        json=body,
        headers=dataset.headers(),
        timeout=TIMEOUT,
    ) as resp:
        assert resp.status_code == 200, resp.read()
        for chunk in resp.iter_bytes():
            frames += [f for f in decoder.feed(chunk) if isinstance(f, BatchFrame)]
        headers = resp.headers
    return Extraction(frames, decoder.close(), headers)


def post(
    server: ServerProcess, body: Any, headers: dict[str, str], **kwargs: Any
) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/extract", json=body, headers=headers, timeout=TIMEOUT, **kwargs
    )


def assert_error(resp: httpx.Response, status: int, code: str) -> ErrorBody:
    """The answer is ``status`` with a JSON ``{"detail", "code"}`` body of that ``code``."""
    assert resp.status_code == status, (resp.status_code, resp.content[:500])
    assert resp.headers["content-type"].startswith("application/json")
    body = ErrorBody.model_validate(resp.json())
    assert body.code == code, body
    assert body.detail
    return body


def metric(server: ServerProcess, name: str, **labels: str) -> float | None:
    """One sample of the server's /metrics, or None when it is not there (yet)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)  # polling a condition with a deadline, not standing in for one


def prepared_extraction(
    scheduler: DeviceScheduler, reservation: Any
) -> tuple[Any, PreparedExtraction]:
    """A prepared extraction holding ``reservation``, and the server state its release uses
    (its weights count the releases in ``released``)."""
    weights = SimpleNamespace(released=0)
    weights.release = lambda model: setattr(weights, "released", weights.released + 1)
    state = SimpleNamespace(weights=weights, metrics=scheduler.metrics)
    prep = PreparedExtraction(
        request=cast(Any, None),
        request_id="r1",
        scheduler=scheduler,
        reservation=reservation,
        model=cast(Any, None),
        images=[],
        labels=[],
        started=0.0,
        queued_s=0.0,
    )
    return state, prep
