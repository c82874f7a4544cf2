"""POST /v1/extract: read a shard and the weights as the caller, plan, run the head, stream frames.

Everything that can be refused with a status code (auth, access, missing objects, sha256,
shard format, limits, memory) is checked before the response starts; a failure after that
(e.g. an image whose body is corrupt past its header) ends the stream with an error frame.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import hapi_models

from hapi_contract import (
    DatasetFormatError,
    ExtractRequest,
    FrameEncoder,
    ModelRef,
    TransformSpec,
    read_shard,
)

from .adaptation import DeviceScheduler, Reservation, make_demand, new_request_id
from .engine import ExtractionJob, JobCancelled, JobStats, run_extraction
from .errors import (
    ChecksumError,
    HapiServerError,
    InvalidRequestError,
    InvalidShardError,
    PayloadTooLargeError,
)
from .state import ServerState
from .swift_io import Caller
from .weights_cache import CachedModel

log = logging.getLogger(__name__)


def to_transform(spec: TransformSpec) -> hapi_models.InputTransform:
    return cast(hapi_models.InputTransform, spec.to_transform())


def check_model(
    ref: ModelRef, split: int | None = None, what: str = "split_index"
) -> hapi_models.ModelSpec:
    try:
        spec = hapi_models.get_spec(ref.arch)
    except hapi_models.UnknownModelError as exc:
        raise InvalidRequestError(str(exc)) from exc
    if split is not None and not 0 <= split <= spec.num_layers:
        raise InvalidRequestError(
            f"{what} {split} out of range for {ref.arch}: must be in [0, {spec.num_layers}]"
        )
    if ref.weights is None:
        raise InvalidRequestError(
            "model.weights is required: store the weights in Swift (`hapi upload model`) and name "
            "them with their sha256, so the server and the client run the same network"
        )
    return spec


async def load_model(
    state: ServerState, caller: Caller, ref: ModelRef, scheduler: DeviceScheduler
) -> CachedModel:
    """The caller's model on the scheduler's device, from the cache or freshly verified."""
    assert ref.weights is not None
    w = ref.weights
    key = (w.sha256, ref.arch, ref.num_classes, scheduler.device.name)
    # Authorise first, cache or not: a cached model is only handed to a caller who may read
    # the weights object, and only while that object is still the blob that was verified.
    etag = await state.swift.head(caller, w.container, w.object)
    async with state.weights.lock_for(key):
        entry = state.weights.lookup(key)
        if entry is not None and entry.etag == etag:
            state.weights.acquire(entry)
            return entry
        blob = await state.swift.get(
            caller, w.container, w.object, max_bytes=state.settings.max_weights_bytes
        )
        digest = hapi_models.sha256_hex(blob.data)
        if digest != w.sha256:
            raise ChecksumError(
                f"weights {w.container}/{w.object} have sha256 {digest}, the request names {w.sha256}"
            )
        loop = asyncio.get_running_loop()

        def build() -> hapi_models.SplittableModel:
            try:
                model = hapi_models.get_model(
                    ref.arch, num_classes=ref.num_classes, weights=blob.data
                )
            except hapi_models.WeightsError as exc:
                raise InvalidRequestError(f"weights {w.container}/{w.object}: {exc}") from exc
            return model.to(scheduler.device.torch_device).eval()

        model = await loop.run_in_executor(state.executor, build)
        entry = state.weights.insert(key, model, blob.etag)
        state.weights.acquire(entry)
        return entry


def _check_images(images: list[bytes], max_pixels: int) -> None:
    import io

    from PIL import Image, UnidentifiedImageError

    for i, data in enumerate(images):
        try:
            with Image.open(io.BytesIO(data)) as img:
                pixels = img.width * img.height
        except UnidentifiedImageError as exc:
            # PIL's message names an in-memory buffer object; say what it means instead.
            raise InvalidShardError(
                f"sample {i}: not a decodable image (unknown or corrupt image format)"
            ) from exc
        except OSError as exc:
            raise InvalidShardError(f"sample {i}: not a decodable image ({exc})") from exc
        if pixels > max_pixels:
            raise PayloadTooLargeError(
                f"sample {i}: {pixels} pixels exceeds the limit of {max_pixels} (max_image_pixels)"
            )


@dataclass
class PreparedExtraction:
    request: ExtractRequest
    request_id: str
    scheduler: DeviceScheduler
    reservation: Reservation
    model: CachedModel
    images: list[bytes]
    labels: list[int]
    started: float
    queued_s: float
    stream_started: bool = False
    finished: bool = False


def finish(state: ServerState, prep: PreparedExtraction, status: str) -> None:
    """Release the request's memory and weights and count it; idempotent, never awaits."""
    if prep.finished:
        return
    prep.finished = True
    prep.scheduler.release(prep.reservation)
    state.weights.release(prep.model)
    elapsed = time.perf_counter() - prep.started
    state.metrics.request_seconds.labels("extract", status).observe(elapsed)
    state.metrics.requests.labels("extract", status).inc()


def abandon(state: ServerState, prep: PreparedExtraction) -> None:
    """The response ended before its stream started (the client left while the request was
    queued, say): nothing else will release the reservation, so release it now."""
    if not prep.stream_started:
        finish(state, prep, "499")


async def prepare(state: ServerState, caller: Caller, req: ExtractRequest) -> PreparedExtraction:
    started = time.perf_counter()
    settings = state.settings
    spec = check_model(req.model, req.split_index)
    request_id = req.request_id or new_request_id()
    transform = to_transform(req.transform)
    scheduler = state.pick_scheduler()

    shard_task = asyncio.create_task(
        state.swift.get(caller, req.container, req.shard, max_bytes=settings.max_object_bytes)
    )
    model_task = asyncio.create_task(load_model(state, caller, req.model, scheduler))
    try:
        shard = await shard_task
    except BaseException:
        model_task.cancel()
        await asyncio.gather(model_task, return_exceptions=True)
        raise
    try:
        samples = read_shard(
            shard.data,
            max_samples=settings.max_samples_per_request,
            num_classes=req.model.num_classes,
        )
    except DatasetFormatError as exc:
        model_task.cancel()
        await asyncio.gather(model_task, return_exceptions=True)
        too_many = "samples" in str(exc) and "more than" in str(exc)
        cls = PayloadTooLargeError if too_many else InvalidShardError
        raise cls(f"shard {req.container}/{req.shard}: {exc}") from exc
    images = [s.image_bytes for s in samples]
    labels = [s.label for s in samples]
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(state.executor, _check_images, images, settings.max_image_pixels)
    except HapiServerError as exc:
        model_task.cancel()
        await asyncio.gather(model_task, return_exceptions=True)
        raise type(exc)(f"shard {req.container}/{req.shard}: {exc.detail}") from exc
    entry = await model_task
    try:
        if req.profile is not None and req.profile.num_layers != spec.num_layers:
            log.warning(
                "%s: client profile has %d layers, %s has %d",
                request_id,
                req.profile.num_layers,
                req.model.arch,
                spec.num_layers,
            )
        est = state.estimator.estimate(
            req.model.arch,
            req.model.num_classes,
            transform.input_shape,
            req.split_index,
            scheduler.device.torch_device.type,
        )
        demand = make_demand(
            request_id,
            est.bytes_per_sample,
            0,  # the weights are resident (counted by the cache) by the time we plan
            settings.b_min,
            min(req.b_max, len(samples)),
        )
        queued_at = time.perf_counter()
        reservation = await scheduler.acquire(demand, pinned_bytes=entry.nbytes)
    except BaseException:
        state.weights.release(entry)
        raise
    return PreparedExtraction(
        request=req,
        request_id=request_id,
        scheduler=scheduler,
        reservation=reservation,
        model=entry,
        images=images,
        labels=labels,
        started=started,
        queued_s=time.perf_counter() - queued_at,
    )


_DONE = object()


async def stream(state: ServerState, prep: PreparedExtraction) -> AsyncIterator[bytes]:
    """Run the job in a worker thread and yield its frames as they are produced."""
    prep.stream_started = True
    req = prep.request
    loop = asyncio.get_running_loop()
    frames: asyncio.Queue[object] = asyncio.Queue(maxsize=4)
    cancelled = threading.Event()
    encoder = FrameEncoder(dtype=req.output_dtype, compression=req.compression)

    def emit(frame: bytes) -> None:
        future = asyncio.run_coroutine_threadsafe(frames.put(frame), loop)
        while True:
            try:
                future.result(timeout=0.5)
                return
            except TimeoutError:
                if cancelled.is_set():
                    future.cancel()
                    raise JobCancelled() from None

    job = ExtractionJob(
        model=prep.model.model,
        split=req.split_index,
        images=prep.images,
        labels=prep.labels,
        transform=to_transform(req.transform),
        batch_size=prep.reservation.batch_size,
        device=prep.scheduler.device,
        dtype=req.output_dtype,
        compression=req.compression,
        max_pixels=state.settings.max_image_pixels,
    )

    def work() -> JobStats | BaseException:
        try:
            return run_extraction(job, encoder, emit, cancelled)
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop as a value
            return exc
        finally:
            asyncio.run_coroutine_threadsafe(frames.put(_DONE), loop)

    future = loop.run_in_executor(state.executor, work)
    status = "200"
    try:
        while True:
            item = await frames.get()
            if item is _DONE:
                break
            assert isinstance(item, bytes)
            state.metrics.bytes_streamed.labels("extract").inc(len(item))
            yield item
        result = await future
        if isinstance(result, JobCancelled):
            return
        if isinstance(result, BaseException):
            status = _error_status(result)
            log.warning("%s failed after the response started: %s", prep.request_id, result)
            yield encoder.error(int(status), _error_detail(result))
            return
        if result.peak_bytes_per_sample is not None:
            state.estimator.observe(
                req.model.arch,
                req.model.num_classes,
                job.transform.input_shape,
                req.split_index,
                job.device.torch_device.type,
                result.peak_bytes_per_sample,
            )
            state.metrics.measured_peak_bytes.labels(job.device.name).set(
                result.peak_bytes_per_sample * job.batch_size
            )
        state.metrics.samples.labels("extract").inc(len(prep.images))
        total = time.perf_counter() - prep.started
        meta = result.as_meta(total, prep.queued_s)
        meta.update(request_id=prep.request_id, device=job.device.name, split_index=req.split_index)
        yield encoder.end(meta=meta)
    finally:
        cancelled.set()

        def done(_: object = None) -> None:
            # Drop frames nobody will read; that also unblocks the worker's last put.
            while not frames.empty():
                frames.get_nowait()
            finish(state, prep, status)

        if future.done():
            done()
        else:
            # The client went away mid-stream: release once the worker has noticed (within one
            # emit timeout). No await here: in the cancelled scope of a disconnected response
            # every await is cancelled again, which skipped the release and leaked the memory.
            future.add_done_callback(done)


def _error_status(exc: BaseException) -> str:
    if isinstance(exc, HapiServerError):
        return str(exc.status)
    if isinstance(exc, hapi_models.ImageDecodeError):
        return "422"
    if (
        isinstance(exc, MemoryError)
        or "out of memory" in str(exc).lower()
        or "can't allocate" in str(exc)
    ):
        return "507"
    return "500"


def _error_detail(exc: BaseException) -> str:
    if isinstance(exc, HapiServerError):
        return exc.detail
    return f"{type(exc).__name__}: {exc}"[:2000]
