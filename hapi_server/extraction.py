"""The server as a host of the extraction core: Swift over HTTP as the caller, worker threads.

The steps of an extraction or a timing are :mod:`hapi_core`'s (:func:`hapi_core.prepare`,
:func:`hapi_core.time_request`); this module performs their effects on the server's event loop
and streams the frames a worker thread produces.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from hapi_contract import ExtractRequest, TimingsRequest, TimingsResponse
from hapi_core import (
    Compute,
    Effect,
    Flow,
    Get,
    GetMany,
    Head,
    JobCancelled,
    JobStats,
    PreparedExtraction,
    Reserve,
    StoredObject,
    abandon,
    conclude,
    finish,
    job_of,
    run_async,
    run_extraction,
    stream_error,
)
from hapi_core import prepare as prepare_flow
from hapi_core import time_request as time_request_flow

from .state import ServerState
from .swift_io import Caller

__all__ = ["ServerHost", "abandon", "prepare", "stream", "time_request"]

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
            case Get(container, obj, max_bytes):
                return state.swift.get(caller, container, obj, max_bytes=max_bytes)
            case GetMany():
                return self.get_many(effect)
            case Compute(work):
                return asyncio.get_running_loop().run_in_executor(state.executor, work)
            case Reserve(scheduler, demand, pinned, refresh):
                return scheduler.acquire(demand, pinned_bytes=pinned, refresh=refresh)
        raise TypeError(f"not an effect: {effect!r}")

    async def get_many(self, effect: GetMany) -> list[StoredObject]:
        """Each object as the caller, at most ``effect.concurrency`` reads in flight. At the first
        refusal no more start (a part naming 1000 deleted images costs at most that many more
        requests, not 999), and it is raised once the reads in flight have finished: cancelling
        them would not stop the proxy's side of their GETs, whose container lookups could then
        write an old ACL back into memcached after the caller, refused, has changed it."""
        swift, caller, objs = self.state.swift, self.caller, effect.objs

        async def one(index: int) -> tuple[int, StoredObject]:
            obj = objs[index]
            return index, await swift.get(
                caller, effect.container, obj, max_bytes=effect.max_bytes_each
            )

        results: dict[int, StoredObject] = {}
        refusal: BaseException | None = None
        started = 0
        in_flight: set[asyncio.Task[tuple[int, StoredObject]]] = set()
        try:
            while in_flight or (refusal is None and started < len(objs)):
                while (
                    refusal is None and started < len(objs) and len(in_flight) < effect.concurrency
                ):
                    in_flight.add(asyncio.create_task(one(started)))
                    started += 1
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if (exc := task.exception()) is not None:
                        refusal = refusal or exc
                    else:
                        index, stored = task.result()
                        results[index] = stored
        finally:
            # Only when this request itself is cancelled (the client left) are reads still running.
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
        if refusal is not None:
            raise refusal
        return [results[i] for i in range(len(objs))]

    async def run(self, flow: Flow[T]) -> T:
        """Run ``flow`` for this host's caller."""
        return await run_async(flow, self.perform)


async def prepare(state: ServerState, caller: Caller, req: ExtractRequest) -> PreparedExtraction:
    """:func:`hapi_core.prepare` for ``caller``."""
    return await ServerHost(state, caller).run(prepare_flow(state, req))


async def time_request(state: ServerState, caller: Caller, req: TimingsRequest) -> TimingsResponse:
    """:func:`hapi_core.time_request` for ``caller``."""
    return await ServerHost(state, caller).run(time_request_flow(state, req))


_DONE = object()


async def stream(state: ServerState, prep: PreparedExtraction) -> AsyncIterator[bytes]:
    """Run the job in a worker thread and yield its frames as they are produced."""
    job = job_of(state, prep)
    loop = asyncio.get_running_loop()
    frames: asyncio.Queue[object] = asyncio.Queue(maxsize=4)
    cancelled = threading.Event()

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

    def work() -> JobStats | BaseException:
        try:
            return run_extraction(job, emit, cancelled)
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
            yield job.encoder.error(code, detail)
            return
        yield job.encoder.end(meta=conclude(state, prep, job, result))
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
