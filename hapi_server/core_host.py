"""The server as a host of the extraction core: Swift over HTTP as the caller, worker threads.

The steps of an extraction or a timing are :mod:`hapi_core`'s (:func:`hapi_core.prepare`,
:func:`hapi_core.time_request`); this module performs their effects on the server's event loop
and streams the frames a worker thread produces.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from hapi_contract import ExtractRequest, TimingsRequest, TimingsResponse
from hapi_core import (
    Await,
    Compute,
    Effect,
    Flow,
    Get,
    GetMany,
    Head,
    JobCancelled,
    JobStats,
    PreparedExtraction,
    ReadWindow,
    Reserve,
    SharedExtraction,
    StoredObject,
    conclude,
    extract_headers,
    finish,
    job_of,
    run_async,
    run_extraction,
    stream_error,
)
from hapi_core import abandon as abandon_prepared
from hapi_core import prepare_extraction as prepare_flow
from hapi_core import time_request as time_request_flow
from hapi_core.flow import Waitable

from .state import ServerState
from .swift_io import Caller

__all__ = ["ServerHost", "abandon", "headers", "prepare", "stream", "time_request"]

Prepared = PreparedExtraction | SharedExtraction

T = TypeVar("T")

log = logging.getLogger(__name__)


class ServerHost:
    """Performs a flow's effects for one caller."""

    def __init__(self, state: ServerState, caller: Caller) -> None:
        self.state = state
        self.caller = caller

    def perform(self, effect: Effect) -> Awaitable[Any]:
        state, caller = self.state, self.caller
        match effect:
            case Head(container, obj):
                return state.swift.head(caller, container, obj)
            case Get():
                return self.get(effect)
            case GetMany():
                return self.get_many(effect)
            case Compute(work):
                return asyncio.get_running_loop().run_in_executor(state.executor, work)
            case Reserve(scheduler, demand, pinned, refresh):
                return scheduler.acquire(demand, pinned_bytes=pinned, refresh=refresh)
            case Await(waitable, timeout_s):
                return wait_settled(waitable, timeout_s)
        raise TypeError(f"not an effect: {effect!r}")

    async def get(self, effect: Get) -> StoredObject:
        stored = await self.state.swift.get(
            self.caller, effect.container, effect.obj, max_bytes=effect.max_bytes, tail=effect.tail
        )
        self.state.metrics.swift_read_bytes.inc(len(stored.data))
        return stored

    async def get_many(self, effect: GetMany) -> list[StoredObject]:
        """Each object as the caller, in asyncio tasks, as :class:`~hapi_core.ReadWindow` says."""
        swift, caller, objs = self.state.swift, self.caller, effect.objs

        async def one(index: int) -> tuple[int, StoredObject | Exception]:
            try:
                stored = await swift.get(
                    caller, effect.container, objs[index], max_bytes=effect.max_bytes_each
                )
            except Exception as exc:  # noqa: BLE001 - the window raises it once the others end
                return index, exc
            self.state.metrics.swift_read_bytes.inc(len(stored.data))
            return index, stored

        window = ReadWindow(effect)
        in_flight: set[asyncio.Task[tuple[int, StoredObject | Exception]]] = set()
        try:
            while window.open:
                in_flight.update(asyncio.create_task(one(i)) for i in window.to_start())
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    window.finished(*task.result())
        finally:
            # Only when this request itself is cancelled (the client left) are reads still running.
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
        return window.result()

    async def run(self, flow: Flow[T]) -> T:
        """Run ``flow`` for this host's caller."""
        return await run_async(flow, self.perform)


async def wait_settled(waitable: Waitable, timeout_s: float) -> object:
    """Wait on the loop, holding no worker thread, for another request's computation: its
    outcome, or its ``timed_out()`` error past ``timeout_s``. Leaving (a timeout, a
    cancellation) tells the computation this request no longer wants it."""
    loop = asyncio.get_running_loop()
    settled: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not settled.done():
            settled.set_result(None)

    def wake() -> None:
        # Called from the thread that settles the computation.
        loop.call_soon_threadsafe(settle)

    leave = waitable.on_settled(wake)
    try:
        await asyncio.wait_for(settled, timeout_s)
    except TimeoutError:
        raise waitable.timed_out() from None
    finally:
        leave()
    return waitable.outcome()


async def prepare(state: ServerState, caller: Caller, req: ExtractRequest) -> Prepared:
    """:func:`hapi_core.prepare_extraction` for ``caller``: features shared with other
    requests (after the caller's own HEADs), or a request to compute."""
    return await ServerHost(state, caller).run(prepare_flow(state, req, caller.storage_url))


def headers(prep: Prepared) -> dict[str, str]:
    """The headers of the extraction's 200."""
    if isinstance(prep, SharedExtraction):
        count = prep.features.count
        return extract_headers(prep.request_id, prep.device, prep.batch_size, count)
    return extract_headers(
        prep.request_id, prep.scheduler.device.name, prep.reservation.batch_size, len(prep.images)
    )


def abandon(state: ServerState, prep: Prepared) -> None:
    """Release what a response that ended before its stream started holds."""
    if isinstance(prep, SharedExtraction):
        _finish_shared(state, prep, "499")
    else:
        abandon_prepared(state, prep)


def _finish_shared(state: ServerState, prep: SharedExtraction, status: str) -> None:
    if not prep.finished:
        prep.finished = True
        elapsed = time.perf_counter() - prep.started
        state.metrics.request_seconds.labels("extract", status).observe(elapsed)
        state.metrics.requests.labels("extract", status).inc()


async def time_request(state: ServerState, caller: Caller, req: TimingsRequest) -> TimingsResponse:
    """:func:`hapi_core.time_request` for ``caller``."""
    return await ServerHost(state, caller).run(time_request_flow(state, req))


_DONE = object()


@dataclass(frozen=True)
class _JobFailure:
    """How a job failed, as its worker thread hands it to the event loop: the error frame's
    status and detail and the error's repr for the log, not the error itself. An error kept
    as the worker's result closes a reference cycle (its traceback's frames hold the
    executor's frame, which holds the result) that only a full garbage collection breaks, and
    until then the frames keep the job's batch: a server whose memory ran out kept 200 MiB of
    failed batches after their error frames and refused requests that fit."""

    status: int
    detail: str
    error: str

    @classmethod
    def of(cls, exc: BaseException) -> _JobFailure:
        status, detail = stream_error(exc)
        return cls(status, detail, repr(exc))


async def stream_shared(state: ServerState, prep: SharedExtraction) -> AsyncIterator[bytes]:
    """Yield shared features re-framed at the request's own COS batch size."""
    loop = asyncio.get_running_loop()
    encoder, frames = prep.frames()
    status = "499"
    encode_s = 0.0
    try:
        while True:
            t0 = time.perf_counter()
            # Encoding (a copy, maybe zstd) off the loop, like a computed request's.
            frame = await loop.run_in_executor(state.executor, next, frames, None)
            encode_s += time.perf_counter() - t0
            if frame is None:
                break
            state.metrics.bytes_streamed.labels("extract").inc(len(frame))
            yield frame
        yield encoder.end(meta=prep.end_meta(encoder, encode_s))
        status = "200"
    finally:
        _finish_shared(state, prep, status)


async def stream(state: ServerState, prep: Prepared) -> AsyncIterator[bytes]:
    """Run the job in a worker thread and yield its frames as they are produced.

    A job that leads a shared computation (:attr:`PreparedExtraction.computation`) belongs to
    every request waiting for it: when its own client leaves, its frames are dropped and it
    runs on while another request still wants the features."""
    if isinstance(prep, SharedExtraction):
        async for frame in stream_shared(state, prep):
            yield frame
        return
    job = job_of(state, prep)
    loop = asyncio.get_running_loop()
    # One frame queued while the loop sends the last: every frame alive beside the batch being
    # computed is planned memory (hapi_core.estimates.FRAMES_IN_FLIGHT).
    frames: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    client_gone = threading.Event()
    computation = prep.computation
    cancelled = computation.cancelled if computation is not None else client_gone

    def emit(frame: bytes) -> None:
        if client_gone.is_set():
            return  # computing for the others; nobody reads this request's frames
        future = asyncio.run_coroutine_threadsafe(frames.put(frame), loop)
        while True:
            try:
                future.result(timeout=0.5)
                return
            except TimeoutError:
                if client_gone.is_set():
                    future.cancel()
                    if cancelled.is_set():
                        raise JobCancelled() from None
                    return

    def work() -> JobStats | _JobFailure | None:
        try:
            return run_extraction(job, emit, cancelled)
        except JobCancelled:
            return None
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop as a value
            return _JobFailure.of(exc)
        finally:
            asyncio.run_coroutine_threadsafe(frames.put(_DONE), loop)

    future = loop.run_in_executor(state.executor, work)
    # The waiting requests are woken as soon as the job ends, however its own client fares.
    future.add_done_callback(
        lambda f: prep.settle_shared(state, not f.cancelled() and isinstance(f.result(), JobStats))
    )
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
        # Settled before the end frame, not left to the callback above: a client that has its
        # response must find its features stored. The callback is only scheduled when the job
        # ends; when it ended before this await, the end frame can be sent and the response
        # closed (``finish``: settled as failed) before the callback runs.
        prep.settle_shared(state, isinstance(result, JobStats))
        if result is None:  # cancelled: nobody reads an error frame
            return
        if isinstance(result, _JobFailure):
            status = str(result.status)
            log.warning("%s failed after the response started: %s", prep.request_id, result.error)
            yield job.encoder.error(result.status, result.detail)
            return
        yield job.encoder.end(meta=conclude(state, prep, job, result))
    finally:
        client_gone.set()
        if computation is not None:
            computation.owner_left()

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
