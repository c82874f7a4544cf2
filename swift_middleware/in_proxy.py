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
from swift_middleware.errors import ChecksumError, HapiResponseError
from swift_middleware.hapi_request import HapiRequest, object_path
from swift_middleware.swift_access import WsgiApp, read_object, stat_object

__all__ = ["InProxyExtractor"]

logger = logging.getLogger(__name__)

CONTENT_TYPE_FRAMES = "application/x-hapi-frames"


@dataclass(frozen=True)
class _Runtime:
    torch: ModuleType
    models: ModuleType
    contract: ModuleType
    device: Any  # torch.device
    server: ModuleType
    """:mod:`hapi_server.inputs`: the server's own checks, so both answer bad input alike."""
    extraction: ModuleType
    estimates: ModuleType
    errors: ModuleType


def _load_runtime(device_name: str, threads: int | None) -> _Runtime:
    # Runs in a pool thread: importing torch takes seconds.
    import hapi_models
    import torch

    import hapi_contract
    from hapi_server import errors, estimates, extraction, inputs

    if threads is not None:
        torch.set_num_threads(threads)
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    return _Runtime(
        torch,
        hapi_models,
        hapi_contract,
        torch.device(device_name),
        server=inputs,
        extraction=extraction,
        estimates=estimates,
        errors=errors,
    )


def _server_checked(rt: _Runtime, check: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one of the HAPI server's checks; its refusal as this filter's error (same status,
    same code), so both executions answer the same bad input the same way."""
    try:
        return check(*args, **kwargs)
    except rt.errors.HapiServerError as exc:
        raise HapiResponseError(
            exc.detail, status=exc.status, code=exc.code, headers=exc.headers
        ) from None


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
        self._profiles: Any = None  # hapi_server.estimates.MemoryEstimator, with the runtime

    def _estimator(self, rt: _Runtime) -> Any:
        if self._profiles is None:
            self._profiles = rt.estimates.MemoryEstimator()
        return self._profiles

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
        _server_checked(rt, rt.extraction.check_model, extract.model, extract.split_index)
        transform = rt.models.InputTransform(
            resize=extract.transform.resize,
            crop=extract.transform.crop,
            mean=tuple(extract.transform.mean),
            std=tuple(extract.transform.std),
        )
        # The server's meta-device profile: a 422 now for an input the network cannot take
        # (a crop too small for its pooling), rather than an error frame after the 200.
        tpool.execute(
            _server_checked,
            rt,
            self._estimator(rt).profile,
            extract.model.arch,
            extract.model.num_classes,
            transform.input_shape,
        )
        self._check_weights_size(rt, extract, None)  # before the shard is read
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
            # The server's own shard checks (format, sample count, image headers).
            result: tuple[list[bytes], list[int]] = _server_checked(
                rt,
                rt.server.parse_shard,
                data,
                what,
                max_samples=self.config.max_samples_per_request,
                max_pixels=self.config.max_image_pixels,
                num_classes=extract.model.num_classes,
            )
            return result

        result: tuple[list[bytes], list[int]] = tpool.execute(parse)
        return result

    def _check_weights_size(self, rt: _Runtime, extract: Any, size: int | None) -> None:
        """The server's cheap model checks: weights of another model or class count, or a
        model over ``max_weights_bytes``, are refused before a byte is read or a model built."""
        ref = extract.model
        fp = tpool.execute(rt.estimates.model_footprint, ref.arch, ref.num_classes)
        _server_checked(
            rt,
            rt.server.check_weights_size,
            size,
            state_bytes=fp.state_bytes,
            state_key_bytes=fp.state_key_bytes,
            num_tensors=fp.num_tensors,
            max_bytes=self.config.max_weights_bytes,
            what=f"weights {ref.weights.container}/{ref.weights.object}",
            model=f"{ref.arch} with {ref.num_classes} classes",
        )

    def _model(self, req: Request, account: str, extract: Any, rt: _Runtime) -> Any:
        ref = extract.model
        w = ref.weights
        path = object_path(account, w.container, w.object)
        what = f"weights {w.container}/{w.object}"
        # Authorise first, cached or not: a cached model goes only to callers who may read the
        # weights, and only while the object is still the blob that was verified.
        etag, size = stat_object(req.environ, self.app, path, what)
        key = (w.sha256, ref.arch, ref.num_classes)
        with self._models_lock:
            cached = self._models.get(key)
            if cached is not None and cached[0] == etag:
                self._models.move_to_end(key)
                return cached[1]
        self._check_weights_size(rt, extract, size)
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
                raise HapiResponseError(
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
