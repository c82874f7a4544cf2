"""In-proxy execution: the extraction runs inside the Swift proxy (``execution = in_proxy``).

This is how the thesis' first prototype ran (its Table 5.1 compares it with the decoupled
server). The proxy is one eventlet hub: CPU or GPU work on it would stall every other request,
so everything heavy (importing torch, building the model, decoding, the forward pass, encoding)
runs in the proxy's thread pool through ``eventlet.tpool.execute``, one COS batch at a time; the
green thread of the request only waits, and the hub keeps serving others. There is no batch
adaptation here: the COS batch is the request's ``b_max`` (capped by ``max_batch``).

The shard and the weights are read through the rest of the pipeline as the caller. torch,
hapi_models and hapi_contract are imported on the first in-proxy request only, so a proxy in
decoupled mode never loads them. The frames on the wire are those of the HAPI server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from eventlet import tpool
from eventlet.semaphore import Semaphore
from swift.common.swob import Request, Response

from swift_middleware.config import FilterConfig
from swift_middleware.errors import BadHapiRequestError, ChecksumError, HapiResponseError
from swift_middleware.hapi_request import HapiRequest, object_path
from swift_middleware.swift_access import WsgiApp, authorize_read, read_object

__all__ = ["InProxyExtractor"]

logger = logging.getLogger(__name__)

CONTENT_TYPE_FRAMES = "application/x-hapi-frames"


@dataclass(frozen=True)
class _Runtime:
    torch: ModuleType
    models: ModuleType
    contract: ModuleType
    device: Any  # torch.device


def _load_runtime(device_name: str, threads: int | None) -> _Runtime:
    # Runs in a pool thread: importing torch takes seconds.
    import hapi_models
    import torch

    import hapi_contract

    if threads is not None:
        torch.set_num_threads(threads)
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    return _Runtime(torch, hapi_models, hapi_contract, torch.device(device_name))


@dataclass
class _Job:
    """One prepared extraction: everything the per-batch work needs."""

    rt: _Runtime
    head: Any  # torch.nn.Module
    transform: Any  # hapi_models.InputTransform
    encoder: Any  # hapi_contract.FrameEncoder
    images: list[bytes]
    labels: list[int]
    batch_size: int
    max_pixels: int
    request_id: str
    split_index: int
    started: float
    queued_s: float
    stats: Any = None  # hapi_server.engine.JobStats, created with the runtime

    def run_batch(self, start: int) -> bytes:
        """Decode, run the head over, and encode samples ``[start, start + batch_size)``."""
        from hapi_server.engine import JobStats, run_batch

        if self.stats is None:
            self.stats = JobStats()
        return run_batch(
            self.head,
            self.transform,
            self.images,
            self.labels,
            start,
            self.batch_size,
            self.rt.device,
            self.encoder,
            self.max_pixels,
            self.stats,
        )

    def end_frame(self) -> bytes:
        from hapi_server.engine import JobStats

        stats = self.stats or JobStats()
        meta = stats.as_meta(time.perf_counter() - self.started, self.queued_s)
        meta.update(
            request_id=self.request_id,
            device=str(self.rt.device),
            split_index=self.split_index,
            execution="in_proxy",
        )
        frame: bytes = self.encoder.end(meta=meta)
        return frame


class _FrameStream:
    """The response body: one frame per COS batch, computed in the pool, then the end frame.

    A class rather than a generator so that ``close`` releases the concurrency slot even when
    the WSGI server never starts iterating (a generator's ``finally`` would not run then).
    """

    def __init__(self, job: _Job, release: Any) -> None:
        self._job = job
        self._release = release
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        job = self._job
        try:
            for start in range(0, len(job.images), job.batch_size):
                yield tpool.execute(job.run_batch, start)
            yield job.end_frame()
        except Exception as exc:  # noqa: BLE001 - the status line is gone: say it in a frame
            status = 422 if isinstance(exc, job.rt.models.ImageDecodeError) else 500
            logger.warning("%s failed after the response started: %r", job.request_id, exc)
            yield job.encoder.error(status, f"{type(exc).__name__}: {exc}"[:2000])
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()


class InProxyExtractor:
    """Runs HAPI extract requests inside the proxy (see the module docstring)."""

    def __init__(self, config: FilterConfig, app: WsgiApp) -> None:
        self.config = config
        self.app = app
        self._runtime: _Runtime | None = None
        self._runtime_lock = Semaphore(1)
        self._slots = Semaphore(config.max_concurrent)
        # (sha256, arch, num_classes) -> (etag, model); LRU. Guarded for pool threads.
        self._models: OrderedDict[tuple[str, str, int], tuple[str, Any]] = OrderedDict()
        self._models_lock = threading.Lock()

    def runtime(self) -> _Runtime:
        """torch and the HAPI packages, imported in the pool on first use."""
        if self._runtime is None:
            with self._runtime_lock:
                if self._runtime is None:
                    self._runtime = tpool.execute(
                        _load_runtime, self.config.device, self.config.torch_threads
                    )
                    logger.info("in-proxy HAPI runtime ready on %s", self._runtime.device)
        return self._runtime

    def handle(self, req: Request, hapi: HapiRequest) -> Response:
        """Authorise, read, prepare and start streaming; HapiResponseError before the stream."""
        started = time.perf_counter()
        rt = self.runtime()
        extract = _validate(rt, hapi.body)
        _check_model(rt, extract)
        transform = rt.models.InputTransform(
            resize=extract.transform.resize,
            crop=extract.transform.crop,
            mean=tuple(extract.transform.mean),
            std=tuple(extract.transform.std),
        )
        self._slots.acquire()
        try:
            return self._start(req, hapi, rt, extract, transform, started)
        except BaseException:
            self._slots.release()
            raise

    def _start(
        self,
        req: Request,
        hapi: HapiRequest,
        rt: _Runtime,
        extract: Any,
        transform: Any,
        started: float,
    ) -> Response:
        """Read the shard and the model as the caller; the response streams, then frees the slot."""
        queued_s = time.perf_counter() - started
        images, labels = self._read_shard(req, hapi, extract, rt)
        model = self._model(req, hapi.account, extract, rt)
        head = model.head(extract.split_index)
        batch_size = max(1, min(extract.b_max, self.config.max_batch, len(images)))
        request_id = extract.request_id or str(req.environ.get("swift.trans_id", "in-proxy"))
        job = _Job(
            rt=rt,
            head=head,
            transform=transform,
            encoder=rt.contract.FrameEncoder(
                dtype=extract.output_dtype, compression=extract.compression
            ),
            images=images,
            labels=labels,
            batch_size=batch_size,
            max_pixels=self.config.max_image_pixels,
            request_id=request_id,
            split_index=extract.split_index,
            started=started,
            queued_s=queued_s,
        )
        # eventlet.wsgi buffers writes below 4 KiB; frames should leave as soon as they exist.
        req.environ["eventlet.minimum_write_chunk_size"] = 0
        headers = {
            "X-Hapi-Request-Id": request_id,
            "X-Hapi-Device": str(rt.device),
            "X-Hapi-Cos-Batch-Size": str(batch_size),
            "X-Hapi-Samples": str(len(images)),
            "X-Hapi-Execution": "in_proxy",
        }
        return Response(
            status=200,
            app_iter=_FrameStream(job, self._slots.release),
            content_type=CONTENT_TYPE_FRAMES,
            headers=headers,
        )

    def _read_shard(
        self, req: Request, hapi: HapiRequest, extract: Any, rt: _Runtime
    ) -> tuple[list[bytes], list[int]]:
        what = f"{hapi.container}/{hapi.obj}"
        data, _ = read_object(
            req.environ, self.app, hapi.object_path, what, limit=self.config.max_object_bytes
        )

        def parse() -> tuple[list[bytes], list[int]]:
            samples = rt.contract.read_shard(
                data,
                max_samples=self.config.max_samples_per_request,
                num_classes=extract.model.num_classes,
            )
            images = [s.image_bytes for s in samples]
            _check_pixels(images, self.config.max_image_pixels)
            return images, [s.label for s in samples]

        try:
            result: tuple[list[bytes], list[int]] = tpool.execute(parse)
        except rt.contract.DatasetFormatError as exc:
            raise BadHapiRequestError(
                f"shard {what}: {exc}", status=422, code="invalid_shard"
            ) from None
        return result

    def _model(self, req: Request, account: str, extract: Any, rt: _Runtime) -> Any:
        ref = extract.model
        w = ref.weights
        path = object_path(account, w.container, w.object)
        what = f"weights {w.container}/{w.object}"
        # Authorise first, cached or not: a cached model goes only to callers who may read the
        # weights, and only while the object is still the blob that was verified.
        etag = authorize_read(req.environ, self.app, path, what)
        key = (w.sha256, ref.arch, ref.num_classes)
        with self._models_lock:
            cached = self._models.get(key)
            if cached is not None and cached[0] == etag:
                self._models.move_to_end(key)
                return cached[1]
        blob, etag = read_object(
            req.environ, self.app, path, what, limit=self.config.max_weights_bytes
        )

        def build() -> Any:
            digest = rt.models.sha256_hex(blob)
            if digest != w.sha256:
                raise ChecksumError(f"{what} have sha256 {digest}, the request names {w.sha256}")
            try:
                model = rt.models.get_model(ref.arch, num_classes=ref.num_classes, weights=blob)
            except rt.models.WeightsError as exc:
                raise BadHapiRequestError(
                    f"{what}: {exc}", status=422, code="invalid_request"
                ) from None
            return model.to(rt.device).eval()

        model = tpool.execute(build)
        if self.config.model_cache_size:
            with self._models_lock:
                self._models[key] = (etag, model)
                self._models.move_to_end(key)
                while len(self._models) > self.config.model_cache_size:
                    self._models.popitem(last=False)
        return model


def _validate(rt: _Runtime, body: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    try:
        return rt.contract.ExtractRequest.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:5]]
        raise HapiResponseError(
            "; ".join(parts) or "invalid request", status=422, code="invalid_request"
        ) from None


def _check_model(rt: _Runtime, extract: Any) -> None:
    ref = extract.model
    try:
        spec = rt.models.get_spec(ref.arch)
    except rt.models.UnknownModelError as exc:
        raise HapiResponseError(str(exc), status=422, code="invalid_request") from None
    if not 0 <= extract.split_index <= spec.num_layers:
        raise HapiResponseError(
            f"split_index {extract.split_index} out of range for {ref.arch}: "
            f"must be in [0, {spec.num_layers}]",
            status=422,
            code="invalid_request",
        )
    if ref.weights is None:
        raise HapiResponseError(
            "model.weights is required: store the weights in Swift (`hapi upload model`) and "
            "name them with their sha256, so the proxy and the client run the same network",
            status=422,
            code="invalid_request",
        )


def _check_pixels(images: list[bytes], max_pixels: int) -> None:
    # Header-only: refuses decompression bombs before any pixel is decoded.
    import io

    from PIL import Image, UnidentifiedImageError

    for i, data in enumerate(images):
        try:
            with Image.open(io.BytesIO(data)) as img:
                pixels = img.width * img.height
        except (UnidentifiedImageError, OSError) as exc:
            raise BadHapiRequestError(
                f"sample {i}: not a decodable image ({exc})", status=422, code="invalid_shard"
            ) from None
        if pixels > max_pixels:
            raise BadHapiRequestError(
                f"sample {i}: {pixels} pixels exceeds the limit of {max_pixels}",
                status=413,
                code="too_large",
            )
