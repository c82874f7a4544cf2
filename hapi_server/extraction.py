"""POST /v1/extract: read a shard and the weights as the caller, plan, run the head, stream frames.

Everything that can be refused with a status code (auth, access, missing objects, sha256,
shard format, limits, memory) is checked before the response starts; a failure after that
(e.g. an image whose body is corrupt past its header) ends the stream with an error frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from hapi_contract import ExtractRequest, ModelRef
from hapi_contract.frames import FrameEncoder

from .adaptation import DeviceScheduler, Reservation, make_demand, new_request_id
from .core import admit_model, build_model, check_weights, input_transform, stream_error
from .engine import ExtractionJob, JobCancelled, JobStats, run_extraction
from .estimates import model_footprint
from .inputs import parse_shard
from .solver import Demand
from .state import ServerState
from .swift_io import Caller, ObjectInfo
from .weights_cache import CachedModel, CacheKey

log = logging.getLogger(__name__)


@dataclass
class ModelPlan:
    """The weights a request needs, authorised and sized, before any of them is loaded."""

    ref: ModelRef
    key: CacheKey
    info: ObjectInfo
    load_bytes: int
    """Memory the planner must admit to load the model (0: the cache already holds it)."""
    entry: CachedModel | None = None
    """The cached model, pinned for this request (released by :func:`release_model`)."""


async def plan_model(
    state: ServerState, caller: Caller, ref: ModelRef, scheduler: DeviceScheduler
) -> ModelPlan:
    """Authorise the weights as the caller and size their load; nothing is read or built.

    Cheap checks come first (the model's weight bytes against ``max_weights_bytes``, the
    object's size from a HEAD against the model's), so weights of another model, or a class
    count whose classifier alone is gigabytes, are refused in milliseconds.
    """
    assert ref.weights is not None
    w = ref.weights
    max_bytes = state.settings.max_weights_bytes
    check_weights(ref, None, max_bytes)
    # Authorise first, cache or not: a cached model is only handed to a caller who may read
    # the weights object, and only while that object is still the blob that was verified.
    info = await state.swift.head(caller, w.container, w.object)
    key: CacheKey = (w.sha256, ref.arch, ref.num_classes, scheduler.device.name)
    entry = state.weights.lookup(key)
    if entry is not None and entry.etag == info.etag:
        state.weights.acquire(entry)
        return ModelPlan(ref, key, info, 0, entry)
    check_weights(ref, info.size, max_bytes)
    # The device memory the model will hold, planned before it is built. The blob itself is
    # transient host memory, bounded by max_weights_bytes and freed once the model is loaded.
    load_bytes = model_footprint(ref.arch, ref.num_classes).resident_bytes
    return ModelPlan(ref, key, info, load_bytes)


async def load_planned(
    state: ServerState,
    caller: Caller,
    plan: ModelPlan,
    scheduler: DeviceScheduler,
    reservation: Reservation,
) -> CachedModel:
    """The planned model on the scheduler's device, loaded within the admitted reservation."""
    if plan.entry is not None:
        return plan.entry
    ref, w = plan.ref, plan.ref.weights
    assert w is not None  # admit_model ran first
    async with state.weights.lock_for(plan.key):
        entry = state.weights.lookup(plan.key)
        if entry is None or entry.etag != plan.info.etag:
            blob = await state.swift.get(
                caller, w.container, w.object, max_bytes=state.settings.max_weights_bytes
            )
            build = functools.partial(build_model, ref, blob.data, scheduler.device.torch_device)
            model = await asyncio.get_running_loop().run_in_executor(state.executor, build)
            entry = state.weights.insert(plan.key, model, blob.etag)
        state.weights.acquire(entry)
    plan.entry = entry
    # The model is resident now (the cache counts it) and the load's copies are gone.
    scheduler.hand_over_model_bytes(reservation, plan.load_bytes)
    return entry


def pin_if_resident(state: ServerState, plan: ModelPlan, demand: Demand) -> Demand:
    """``demand`` less the model's load once the cache holds the planned model (another
    request loaded it meanwhile), which is then pinned for this request; for a waiting request,
    before each planning round (see :meth:`DeviceScheduler.acquire`)."""
    if plan.entry is not None or plan.load_bytes == 0:
        return demand
    entry = state.weights.lookup(plan.key)
    if entry is None or entry.etag != plan.info.etag:
        return demand
    state.weights.acquire(entry)
    load, plan.entry, plan.load_bytes = plan.load_bytes, entry, 0
    return dataclasses.replace(demand, model_bytes=max(0, demand.model_bytes - load))


def release_model(state: ServerState, plan: ModelPlan) -> None:
    """Unpin the plan's model, if it holds one (after an error before the request ran)."""
    if plan.entry is not None:
        state.weights.release(plan.entry)
        plan.entry = None


async def read_checked_shard(
    state: ServerState, caller: Caller, container: str, shard: str, num_classes: int
) -> tuple[list[bytes], list[int]]:
    """A shard's images and labels, read as the caller and checked (format, counts, headers)."""
    settings = state.settings
    blob = await state.swift.get(caller, container, shard, max_bytes=settings.max_object_bytes)
    parse = functools.partial(
        parse_shard,
        blob.data,
        f"{container}/{shard}",
        max_samples=settings.max_samples_per_request,
        max_pixels=settings.max_image_pixels,
        num_classes=num_classes,
    )
    return await asyncio.get_running_loop().run_in_executor(state.executor, parse)


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
    """Everything refusable with a status, in cost order: cheap checks, reads, admission, load."""
    started = time.perf_counter()
    settings = state.settings
    spec = admit_model(req.model, req.split_index)
    request_id = req.request_id or new_request_id()
    transform = input_transform(req.transform)
    scheduler = state.pick_scheduler()
    if req.profile is not None and req.profile.num_layers != spec.num_layers:
        log.warning(
            "%s: client profile has %d layers, %s has %d",
            request_id,
            req.profile.num_layers,
            req.model.arch,
            spec.num_layers,
        )
    # A meta-device profile: milliseconds, and a 422 for a crop the network cannot take.
    est = state.estimator.estimate(
        req.model.arch,
        req.model.num_classes,
        transform.input_shape,
        req.split_index,
        scheduler.device.torch_device.type,
    )
    shard_task = asyncio.create_task(
        read_checked_shard(state, caller, req.container, req.shard, req.model.num_classes)
    )
    try:
        plan = await plan_model(state, caller, req.model, scheduler)
    except BaseException:
        shard_task.cancel()
        await asyncio.gather(shard_task, return_exceptions=True)
        raise
    try:
        images, labels = await shard_task
        demand = make_demand(
            request_id,
            est.bytes_per_sample,
            plan.load_bytes,  # 0 when the weights are resident (counted by the cache)
            settings.b_min,
            min(req.b_max, len(images)),
        )
        queued_at = time.perf_counter()
        pinned = plan.entry.nbytes if plan.entry is not None else 0
        reservation = await scheduler.acquire(
            demand, pinned_bytes=pinned, refresh=functools.partial(pin_if_resident, state, plan)
        )
        try:
            entry = await load_planned(state, caller, plan, scheduler, reservation)
        except BaseException:
            scheduler.release(reservation)
            raise
    except BaseException:
        release_model(state, plan)
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
        transform=input_transform(req.transform),
        batch_size=prep.reservation.batch_size,
        device=prep.scheduler.device,
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
            code, detail = stream_error(result)
            status = str(code)
            log.warning("%s failed after the response started: %r", prep.request_id, result)
            yield encoder.error(code, detail)
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
