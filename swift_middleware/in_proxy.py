"""In-proxy execution: the extraction runs inside the Swift proxy (``execution = in_proxy``).

This is how the thesis' first prototype ran (its Table 5.1 compares it with the decoupled
server). The extraction itself is the HAPI server's core (:mod:`hapi_server.core`,
:mod:`hapi_server.inputs`, :mod:`hapi_server.engine`): the same model admission, shard and
image checks, head execution and frames, so both executions answer alike. What is this
module's own is the WSGI glue and the proxy's thread pool: the proxy is one eventlet hub, and
CPU or GPU work on it would stall every other request, so everything heavy (importing torch,
building the model, checking the shard, the forward pass, encoding) runs through
``eventlet.tpool.execute``, one COS batch at a time; the request's green thread only waits.
There is no batch adaptation here: the COS batch is the request's ``b_max`` (capped by
``max_batch``). A timing request (``X-Hapi-Request: timings``) takes a concurrency slot like an
extraction and times the head with the server's own measurement
(:func:`hapi_server.timing.measure_head`); its layer times are kept per model and device here as
the server keeps them.

The shard and the weights are read through the rest of the pipeline as the caller. torch and
the HAPI server's modules are imported on the first in-proxy request only, so a proxy in
decoupled mode never loads them.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from eventlet import tpool
from eventlet.semaphore import Semaphore
from pydantic import BaseModel, ValidationError
from swift.common.swob import Request, Response

from hapi_contract import (
    CONTENT_TYPE_FRAMES,
    HEADER_EXECUTION,
    ExtractRequest,
    ModelRef,
    TimingsRequest,
)
from swift_middleware.config import Execution, FilterConfig
from swift_middleware.errors import HapiResponseError
from swift_middleware.hapi_request import HapiRequest, object_path
from swift_middleware.swift_access import Logger, WsgiApp, read_object, stat_object

if TYPE_CHECKING:
    import hapi_models
    import torch

    from hapi_contract.frames import FrameEncoder
    from hapi_server.engine import JobStats
    from hapi_server.estimates import MemoryEstimator
    from hapi_server.timing_cache import LayerTimes

__all__ = ["InProxyExtractor"]

P = ParamSpec("P")
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def _server_checked(check: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run one of the core's checks; its refusal as this filter's error (same status and
    code), so both executions answer the same bad input the same way."""
    from hapi_server.errors import HapiServerError

    try:
        return check(*args, **kwargs)
    except HapiServerError as exc:
        raise HapiResponseError(
            exc.detail, status=exc.status, code=exc.code, headers=exc.headers
        ) from None


def _in_pool(check: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """:func:`_server_checked` in the proxy's thread pool (for anything that computes)."""
    result: T = tpool.execute(_server_checked, check, *args, **kwargs)
    return result


@dataclass(frozen=True)
class _Runtime:
    """What the first in-proxy request loads, in the pool: torch, its device, the profiles."""

    device: torch.device
    estimator: MemoryEstimator
    layer_times: LayerTimes


def _load_runtime(device_name: str, threads: int | None) -> _Runtime:
    # Runs in a pool thread: importing torch takes seconds.
    import torch

    from hapi_server.estimates import MemoryEstimator
    from hapi_server.timing_cache import LayerTimes

    if threads is not None:
        torch.set_num_threads(threads)
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    return _Runtime(torch.device(device_name), MemoryEstimator(), LayerTimes.empty())


def _validate(body: dict[str, object], schema: type[M]) -> M:
    from hapi_server.core import validation_detail

    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise HapiResponseError(
            validation_detail(exc.errors()), status=422, code="invalid_request"
        ) from None


@dataclass
class _Job:
    """One prepared extraction: everything the per-batch work needs."""

    head: torch.nn.Module
    transform: hapi_models.InputTransform
    encoder: FrameEncoder
    images: list[bytes]
    labels: list[int]
    batch_size: int
    max_pixels: int
    device: torch.device
    request_id: str
    split_index: int
    started: float
    queued_s: float
    stats: JobStats = field(init=False)

    def __post_init__(self) -> None:
        from hapi_server.engine import JobStats

        self.stats = JobStats()

    def run_batch(self, start: int) -> bytes:
        """Decode, run the head over, and encode samples ``[start, start + batch_size)``."""
        from hapi_server.engine import run_batch

        return run_batch(
            self.head,
            self.transform,
            self.images,
            self.labels,
            start,
            self.batch_size,
            self.device,
            self.encoder,
            self.max_pixels,
            self.stats,
        )

    def end_frame(self) -> bytes:
        meta = self.stats.as_meta(time.perf_counter() - self.started, self.queued_s)
        meta.update(
            request_id=self.request_id,
            device=str(self.device),
            split_index=self.split_index,
            execution=Execution.IN_PROXY.value,
        )
        return self.encoder.end(meta=meta)


class _FrameStream:
    """The response body: one frame per COS batch, computed in the pool, then the end frame.

    A class rather than a generator so that ``close`` releases the concurrency slot even when
    the WSGI server never starts iterating (a generator's ``finally`` would not run then).
    """

    def __init__(self, job: _Job, release: Callable[[], None], logger: Logger) -> None:
        self._job = job
        self._release = release
        self._logger = logger
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        from hapi_server.core import stream_error

        job = self._job
        try:
            for start in range(0, len(job.images), job.batch_size):
                frame: bytes = tpool.execute(job.run_batch, start)
                yield frame
            yield job.end_frame()
        except Exception as exc:  # noqa: BLE001 - the status line is gone: say it in a frame
            status, detail = stream_error(exc)
            self._logger.warning("%s failed after the response started: %r", job.request_id, exc)
            yield job.encoder.error(status, detail)
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()


class InProxyExtractor:
    """Runs HAPI extract requests inside the proxy (see the module docstring)."""

    def __init__(self, config: FilterConfig, app: WsgiApp, logger: Logger) -> None:
        self.config = config
        self.app = app
        self.logger = logger
        self._runtime: _Runtime | None = None
        self._runtime_lock = Semaphore(1)
        self._slots = Semaphore(config.max_concurrent)
        # (sha256, arch, num_classes) -> (etag, model); LRU. Guarded for pool threads.
        self._models: OrderedDict[tuple[str, str, int], tuple[str, hapi_models.SplittableModel]]
        self._models = OrderedDict()
        self._models_lock = threading.Lock()

    def runtime(self) -> _Runtime:
        """torch and the HAPI core, imported in the pool on first use."""
        if self._runtime is None:
            with self._runtime_lock:
                if self._runtime is None:
                    runtime: _Runtime = tpool.execute(
                        _load_runtime, self.config.device, self.config.torch_threads
                    )
                    self._runtime = runtime
                    self.logger.info("in-proxy HAPI runtime ready on %s", runtime.device)
        return self._runtime

    def handle(self, req: Request, hapi: HapiRequest) -> Response:
        """Authorise, read, prepare and start streaming; HapiResponseError before the stream.

        A timing request is answered whole (JSON) once it ran, and frees its slot then.
        """
        from hapi_server import core

        started = time.perf_counter()
        rt = self.runtime()
        timings = hapi.operation == "timings"
        extract = _validate(hapi.body, TimingsRequest if timings else ExtractRequest)
        _server_checked(core.admit_model, extract.model, extract.split_index)
        transform = core.input_transform(extract.transform)
        # The server's meta-device profile: a 422 now for an input the network cannot take
        # (a crop too small for its pooling), rather than an error frame after the 200.
        ref = extract.model
        _in_pool(rt.estimator.profile, ref.arch, ref.num_classes, transform.input_shape)
        self._check_weights(ref, None)  # before the shard is read
        self._slots.acquire()
        if isinstance(extract, TimingsRequest):
            try:
                return self._time(req, hapi, rt, extract, transform)
            finally:
                self._slots.release()
        try:
            return self._start(req, hapi, rt, extract, transform, started)
        except BaseException:
            self._slots.release()
            raise

    def _time(
        self,
        req: Request,
        hapi: HapiRequest,
        rt: _Runtime,
        timing: TimingsRequest,
        transform: hapi_models.InputTransform,
    ) -> Response:
        """Time the head over the shard's first images, as the HAPI server's timings do."""
        from hapi_server.core import raising_server_errors
        from hapi_server.timing import time_head

        images, _ = self._read_shard(req, hapi, timing)
        model = self._model(req, hapi.account, timing.model, rt)
        answer = _in_pool(
            raising_server_errors,
            time_head,
            model,
            timing,
            images[: min(timing.samples, self.config.max_batch)],
            transform,
            rt.device,
            rt.layer_times,
            self.config.max_image_pixels,
            # Other requests running or waiting for a slot (this one holds a slot now).
            max(0, self.config.max_concurrent - self._slots.balance - 1),
        )
        return Response(
            status=200,
            body=answer.model_dump_json().encode(),
            content_type="application/json",
            headers={HEADER_EXECUTION: Execution.IN_PROXY.value},
        )

    def _start(
        self,
        req: Request,
        hapi: HapiRequest,
        rt: _Runtime,
        extract: ExtractRequest,
        transform: hapi_models.InputTransform,
        started: float,
    ) -> Response:
        """Read the shard and the model as the caller; the response streams, then frees the slot."""
        from hapi_contract.frames import FrameEncoder
        from hapi_server.core import extract_headers

        queued_s = time.perf_counter() - started
        images, labels = self._read_shard(req, hapi, extract)
        model = self._model(req, hapi.account, extract.model, rt)
        batch_size = max(1, min(extract.b_max, self.config.max_batch, len(images)))
        request_id = extract.request_id or str(req.environ.get("swift.trans_id", "in-proxy"))
        job = _Job(
            head=model.head(extract.split_index),
            transform=transform,
            encoder=FrameEncoder(dtype=extract.output_dtype, compression=extract.compression),
            images=images,
            labels=labels,
            batch_size=batch_size,
            max_pixels=self.config.max_image_pixels,
            device=rt.device,
            request_id=request_id,
            split_index=extract.split_index,
            started=started,
            queued_s=queued_s,
        )
        # eventlet.wsgi buffers writes below 4 KiB; frames should leave as soon as they exist.
        req.environ["eventlet.minimum_write_chunk_size"] = 0
        headers = extract_headers(request_id, str(rt.device), batch_size, len(images))
        headers[HEADER_EXECUTION] = Execution.IN_PROXY.value
        return Response(
            status=200,
            app_iter=_FrameStream(job, self._slots.release, self.logger),
            content_type=CONTENT_TYPE_FRAMES,
            headers=headers,
        )

    def _read_shard(
        self, req: Request, hapi: HapiRequest, extract: ExtractRequest
    ) -> tuple[list[bytes], list[int]]:
        from hapi_server.inputs import parse_shard

        what = f"{hapi.container}/{hapi.obj}"
        data, _ = read_object(
            req.environ, self.app, hapi.object_path, what, limit=self.config.max_object_bytes
        )
        # The core's shard checks (format, sample count, image headers), in the pool.
        return _in_pool(
            parse_shard,
            data,
            what,
            max_samples=self.config.max_samples_per_request,
            max_pixels=self.config.max_image_pixels,
            num_classes=extract.model.num_classes,
        )

    def _check_weights(self, ref: ModelRef, size: int | None) -> None:
        """The core's cheap model checks: weights of another model or class count, or a model
        over ``max_weights_bytes``, are refused before a byte is read or a model built."""
        from hapi_server.core import check_weights

        _in_pool(check_weights, ref, size, self.config.max_weights_bytes)

    def _model(
        self, req: Request, account: str, ref: ModelRef, rt: _Runtime
    ) -> hapi_models.SplittableModel:
        from hapi_server.core import build_model

        w = ref.weights
        assert w is not None  # admit_model ran first
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
        self._check_weights(ref, size)
        blob, etag = read_object(
            req.environ, self.app, path, what, limit=self.config.max_weights_bytes
        )
        model = _in_pool(build_model, ref, blob, rt.device)
        if self.config.model_cache_size:
            with self._models_lock:
                self._models[key] = (etag, model)
                self._models.move_to_end(key)
                while len(self._models) > self.config.model_cache_size:
                    self._models.popitem(last=False)
        return model
