"""In-proxy execution: the extraction core runs inside the Swift proxy (``execution = in_proxy``).

This is how the thesis' first prototype ran (its Table 5.1 compares it with the decoupled
server). The extraction is :mod:`hapi_core`'s, step for step the HAPI server's: the same model
admission and verified-weights cache, shard and image checks, memory planning with batch
adaptation (a request that cannot fit ``memory_budget_bytes`` is a 507 ``insufficient_memory``,
one that waits too long a 504, a full queue a 503), head execution, frames and layer timing.
What is this module's own is how the core's effects are performed here:

* reads go through the rest of the proxy pipeline as the caller (a HEAD or GET subrequest), so
  tempauth or keystone and the container ACLs decide, as for any GET; the images of a
  ``folder`` dataset's part are GET subrequests from a pool of green threads, at most
  ``object_read_concurrency`` at once;
* compute (importing torch, profiling, checking the shard, building the model, every COS
  batch, timing) runs through ``eventlet.tpool.execute``: the proxy is one eventlet hub, and CPU
  or GPU work on it would stall every other request;
* a request waiting for memory waits on an eventlet event, holding no thread; the planner's
  rounds are eventlet timers. The scheduler is only ever touched from the hub;
* object reads yield to the hub after every chunk (:func:`swift_access.read_object`), so a
  plain GET through the proxy is answered while a large shard or weights file is read;
* every wait is bounded: a request has ``request_timeout`` from its arrival for its slot
  (:class:`~swift_middleware.slots.Slots`, at most ``queue_limit`` waiting), its reads and its
  memory (503 ``queue_full`` / 504 ``timeout``, the core's answers); a client that takes no
  frame for ``send_timeout`` is cut off, and its slot and memory are freed.

torch and the core's modules are imported when an in-proxy filter is built, while the proxy
loads its pipeline and serves nothing yet; a proxy in decoupled mode never loads them. Imported
on the first request instead, they stalled the whole proxy for seconds: importing them on the
hub (a request's first ``from hapi_core import ...``) blocks every green thread, and one imported
in the pool holds the GIL (loading torch's shared libraries) and the module locks that a
request's import on the hub then waits for (a plain GET through the proxy took 3.8-4.5 s during
eight concurrent first requests). The runtime itself (threads, devices, the memory sampler) is
still created on the first request, in the pool: a pre-forking proxy builds its filters once in
the parent before forking its workers, and threads do not survive a fork.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import eventlet
from eventlet import tpool
from eventlet.event import Event
from eventlet.queue import LightQueue
from eventlet.semaphore import Semaphore
from pydantic import ValidationError
from swift.common.swob import Request, Response

from hapi_contract import (
    CONTENT_TYPE_FRAMES,
    HEADER_AUTH_TOKEN,
    HEADER_EXECUTION,
    ExtractRequest,
    TimingsRequest,
)
from hapi_core.errors import InvalidRequestError
from hapi_core.host_allocator import bound_host_allocator
from swift_middleware.config import Execution, FilterConfig
from swift_middleware.hapi_request import HapiRequest, object_path
from swift_middleware.slots import Slots
from swift_middleware.swift_access import Logger, WsgiApp, read_object, stat_object

if TYPE_CHECKING:
    from hapi_core import (
        CoreRuntime,
        DeviceScheduler,
        Effect,
        ExtractionJob,
        GetMany,
        Metrics,
        PreparedExtraction,
        Reservation,
        SharedExtraction,
        StoredObject,
    )
    from hapi_core.flow import Waitable
    from hapi_core.solver import Demand

__all__ = ["InProxyExtractor"]


class _EventletTimers:
    """The planner's rounds as eventlet timers: they run on the hub, like every request."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        eventlet.spawn_after(delay, callback)


def _import_core() -> None:
    """Import every module of the core that a request will use, torch and torchvision's models
    and transforms (what :meth:`CoreRuntime.create` takes) included (see the module doc)."""
    import hapi_core

    for name in hapi_core.__all__:
        getattr(hapi_core, name)  # each lazy export imports its module
    import torchvision.models
    import torchvision.transforms.v2  # noqa: F401

    # The imports leave about 400,000 objects that the cyclic collector would walk at every
    # full collection for as long as the proxy runs: 0.5-0.6 s holding the GIL each time
    # (measured on 2 shared cores), a stall of the hub whichever thread collects. Frozen,
    # they are never walked again; they stay the process's for good anyway.
    gc.freeze()


def _load_runtime(config: FilterConfig) -> CoreRuntime:
    # Runs in a pool thread: discovering the devices and starting the runtime's threads.
    from hapi_core import CoreRuntime

    return CoreRuntime.create(config.core_settings(), timers=_EventletTimers())


def _wait_for_memory(
    scheduler: DeviceScheduler,
    demand: Demand,
    pinned_bytes: int,
    refresh: Callable[[Demand], Demand],
    deadline: float,
) -> Reservation:
    """:meth:`DeviceScheduler.acquire` for a green thread: the same refusals and timeout, the
    timeout counted from the request's arrival (``deadline``, ``time.monotonic``)."""
    ready = Event()

    def wake() -> None:
        if not ready.ready():
            ready.send(None)

    with scheduler.waiting(demand, pinned_bytes, refresh, on_ready=wake) as ticket:
        try:
            with eventlet.Timeout(max(0.0, deadline - time.monotonic())):
                ready.wait()
        except eventlet.Timeout as exc:
            raise scheduler.timed_out(ticket) from exc
    assert ticket.reservation is not None
    return ticket.reservation


def _wait_settled(waitable: Waitable, timeout_s: float, deadline: float) -> object:
    """Wait on an eventlet event, holding no thread, for another request's computation (see
    :mod:`hapi_core.shared_features`): its outcome, or its timeout error past ``timeout_s`` or
    the request's ``deadline``. It is settled from a green thread of this hub."""
    ready = Event()

    def wake() -> None:
        if not ready.ready():
            ready.send(None)

    leave = waitable.on_settled(wake)
    try:
        with eventlet.Timeout(max(0.0, min(timeout_s, deadline - time.monotonic()))):
            ready.wait()
    except eventlet.Timeout:
        raise waitable.timed_out() from None
    finally:
        leave()
    return waitable.outcome()


class _ProxyHost:
    """Performs a core flow's effects for one request, as its caller (see the module doc)."""

    def __init__(
        self,
        req: Request,
        hapi: HapiRequest,
        app: WsgiApp,
        deadline: float,
        logger: Logger,
        metrics: Metrics | None = None,
    ) -> None:
        self._env = req.environ
        self._account = hapi.account
        self.account = hapi.account
        """The caller's account: names the objects the feature store shares."""
        self._app = app
        self.deadline = deadline
        self._logger = logger
        self._metrics = metrics

    def perform(self, effect: Effect) -> Any:
        from hapi_core import Await, Compute, Get, GetMany, Head, ObjectInfo, Reserve

        match effect:
            case Head(container, obj):
                path = object_path(self._account, container, obj)
                etag, size = stat_object(self._env, self._app, path, f"{container}/{obj}")
                return ObjectInfo(etag, size)
            case Get(container, obj, max_bytes, tail):
                return self._get(container, obj, max_bytes, tail)
            case GetMany():
                return self._get_many(effect)
            case Compute(work):
                return tpool.execute(work)
            case Reserve(scheduler, demand, pinned, refresh):
                return _wait_for_memory(scheduler, demand, pinned, refresh, self.deadline)
            case Await(waitable, timeout_s):
                return _wait_settled(waitable, timeout_s, self.deadline)
        raise TypeError(f"not an effect: {effect!r}")

    def _get(self, container: str, obj: str, max_bytes: int, tail: int = 0) -> StoredObject:
        from hapi_core import StoredObject

        path = object_path(self._account, container, obj)
        what = f"{container}/{obj}"
        self._logger.debug("HAPI read of %s started", what)
        data, etag = read_object(
            self._env, self._app, path, what, limit=max_bytes, deadline=self.deadline, tail=tail
        )
        self._logger.debug("HAPI read of %s done: %d bytes", what, len(data))
        if self._metrics is not None:
            self._metrics.swift_read_bytes.inc(len(data))
        # Held once, as read: bytes() would copy the whole object.
        return StoredObject(data, etag)

    def _get_many(self, effect: GetMany) -> list[StoredObject]:
        """Green threads, one GET subrequest each, as :class:`~hapi_core.ReadWindow` says.

        The reads in flight at a refusal are waited for, never killed: a green thread killed
        inside Swift's pipeline gets ``GreenletExit`` wherever it waits, and ``MemcacheRing``
        gives a pooled connection back only on ``Exception``, so a kill during a token or
        container-info lookup leaks that connection for good; two leaks (the pool's default
        size) and every later lookup of that proxy times out, which tempauth answers with a 401
        to every caller.
        """
        from hapi_core import ReadWindow

        objs = effect.objs
        arrived: LightQueue = LightQueue()

        def one(index: int) -> None:
            try:
                stored = self._get(effect.container, objs[index], effect.max_bytes_each)
            except Exception as exc:  # noqa: BLE001 - handed to the window as the read's outcome
                arrived.put((index, exc))
            else:
                arrived.put((index, stored))

        window = ReadWindow(effect)
        while window.open:
            for index in window.to_start():
                eventlet.spawn_n(one, index)
            window.finished(*arrived.get())
        return window.result()


class _FrameStream:
    """The response body: one frame per COS batch, computed in the pool, then the end frame.

    A class rather than a generator so that ``close`` releases the request's memory, weights
    and concurrency slot even when the WSGI server never starts iterating (a generator's
    ``finally`` would not run then).
    """

    def __init__(
        self,
        rt: CoreRuntime,
        prep: PreparedExtraction,
        job: ExtractionJob,
        release_slot: Callable[[], None],
        logger: Logger,
        send_timeout_s: float,
    ) -> None:
        self._rt = rt
        self._prep = prep
        self._job = job
        self._release_slot = release_slot
        self._logger = logger
        self._send_timeout_s = send_timeout_s
        self._status = "499"  # the client left before the body started
        self._sending = False
        self._closed = False

    def _send(self, chunk: bytes) -> Iterator[bytes]:
        """Hand ``chunk`` to the WSGI server, which must have written it within the send timeout.

        The timer is armed only while this generator is suspended at ``yield``: the green
        thread is then in the server's write of ``chunk`` to the client's socket (the proxy's
        middlewares only pass chunks on), never inside Swift's memcached client or a subrequest,
        where an exception thrown in could leak a pooled connection. ``eventlet.wsgi`` answers
        the timeout as a failed write: it closes the connection and calls :meth:`close`.
        """
        self._sending = True
        with eventlet.Timeout(self._send_timeout_s):
            yield chunk
        self._sending = False

    def __iter__(self) -> Iterator[bytes]:
        from hapi_core import JobStats, conclude, iter_frames, stream_error

        job, stats = self._job, JobStats()
        self._status = "200"
        try:
            frames = iter_frames(job, stats)
            while (frame := tpool.execute(next, frames, None)) is not None:
                self._rt.metrics.bytes_streamed.labels("extract").inc(len(frame))
                yield from self._send(frame)
            end = job.encoder.end(meta=self._end_meta(conclude(self._rt, self._prep, job, stats)))
            # The requests waiting for this job's features get them now. A leading job whose
            # client leaves stops (the proxy computes only while its client reads): its waiters
            # are then told there is nothing to share and compute their own.
            self._prep.settle_shared(self._rt, succeeded=True)
            yield from self._send(end)
        except Exception as exc:  # noqa: BLE001 - the status line is gone: say it in a frame
            code, detail = stream_error(exc)
            self._status = str(code)
            self._logger.warning(
                "%s failed after the response started: %r", self._prep.request_id, exc
            )
            yield from self._send(job.encoder.error(code, detail))
        finally:
            self.close()

    @staticmethod
    def _end_meta(meta: dict[str, object]) -> dict[str, object]:
        meta["execution"] = Execution.IN_PROXY.value
        return meta

    def close(self) -> None:
        if not self._closed:
            from hapi_core import finish

            self._closed = True
            if self._sending:
                self._status = "499"
                self._logger.warning(
                    "HAPI stream %s cut off: the client took no frame within %s s "
                    "(send_timeout) or left",
                    self._prep.request_id,
                    self._send_timeout_s,
                )
            finish(self._rt, self._prep, self._status)
            self._release_slot()


class _SharedFrameStream:
    """The response body of a request served shared features (see
    :mod:`hapi_core.shared_features`): re-framed at its own COS batch in the pool, then the
    end frame; ``close`` counts the request and frees its slot."""

    def __init__(
        self,
        rt: CoreRuntime,
        shared: SharedExtraction,
        release_slot: Callable[[], None],
        send_timeout_s: float,
    ) -> None:
        self._rt = rt
        self._shared = shared
        self._release_slot = release_slot
        self._send_timeout_s = send_timeout_s
        self._status = "499"
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        encoder, frames = self._shared.frames()
        encode_s = 0.0
        try:
            while True:
                t0 = time.perf_counter()
                frame = tpool.execute(next, frames, None)
                encode_s += time.perf_counter() - t0
                if frame is None:
                    break
                self._rt.metrics.bytes_streamed.labels("extract").inc(len(frame))
                with eventlet.Timeout(self._send_timeout_s):
                    yield frame
            meta = _FrameStream._end_meta(self._shared.end_meta(encoder, encode_s))
            with eventlet.Timeout(self._send_timeout_s):
                yield encoder.end(meta=meta)
            self._status = "200"
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            elapsed = time.perf_counter() - self._shared.started
            self._rt.metrics.request_seconds.labels("extract", self._status).observe(elapsed)
            self._rt.metrics.requests.labels("extract", self._status).inc()
            self._release_slot()


class InProxyExtractor:
    """Runs HAPI requests inside the proxy (see the module docstring)."""

    def __init__(self, config: FilterConfig, app: WsgiApp, logger: Logger) -> None:
        self.config = config
        self.app = app
        self.logger = logger
        # Now, while the proxy loads its filters: glibc fixes its arena limit when a second
        # thread first needs an arena, and the pool threads that would are not started yet.
        bound_host_allocator()
        _import_core()
        self._runtime: CoreRuntime | None = None
        self._runtime_lock = Semaphore(1)
        self._slots = Slots(
            config.max_concurrent,
            queue_limit=config.queue_limit,
            retry_after_s=config.retry_after,
        )

    def runtime(self) -> CoreRuntime:
        """The core's runtime (torch, the devices, the planner), created in the pool on first use."""
        if self._runtime is None:
            with self._runtime_lock:
                if self._runtime is None:
                    runtime: CoreRuntime = tpool.execute(_load_runtime, self.config)
                    self._runtime = runtime
                    self.logger.info(
                        "in-proxy HAPI runtime ready on %s",
                        ", ".join(d.name for d in runtime.devices),
                    )
        return self._runtime

    def handle(self, req: Request, hapi: HapiRequest) -> Response:
        """Run the core's flow for ``hapi``; a refusal raises before the response starts.

        A timing request is answered whole (JSON) once it ran; an extraction streams, and its
        stream frees the memory, the weights and the slot when it ends.
        """
        from hapi_core import check_token

        # Every read is the caller's own, as on the HAPI server: no token, no extraction, even
        # from a public (.r:*) container.
        check_token(req.headers.get(HEADER_AUTH_TOKEN) or req.headers.get("X-Storage-Token"))
        deadline = time.monotonic() + self.config.request_timeout
        rt = self.runtime()
        host = _ProxyHost(req, hapi, self.app, deadline, self.logger, rt.metrics)
        request_id = str(req.environ.get("swift.trans_id") or "")
        self.logger.debug(
            "HAPI request %s asks for a slot (%d of %d busy, %d waiting)",
            request_id,
            self._slots.busy,
            self._slots.size,
            self._slots.waiting,
        )
        self._slots.acquire(deadline, request_id)
        self.logger.debug("HAPI request %s took a slot", request_id)
        try:
            if hapi.operation == "timings":
                return self._time(rt, host, _validate(hapi.body, TimingsRequest))
            return self._extract(req, rt, host, _validate(hapi.body, ExtractRequest))
        except BaseException:
            self._slots.release()
            raise

    def _time(self, rt: CoreRuntime, host: _ProxyHost, timing: TimingsRequest) -> Response:
        from hapi_core import run_blocking, time_request

        answer = run_blocking(time_request(rt, timing), host.perform)
        self._slots.release()
        return Response(
            status=200,
            body=answer.model_dump_json().encode(),
            content_type="application/json",
            headers={HEADER_EXECUTION: Execution.IN_PROXY.value},
        )

    def _extract(
        self, req: Request, rt: CoreRuntime, host: _ProxyHost, extract: ExtractRequest
    ) -> Response:
        from hapi_core import (
            SharedExtraction,
            abandon,
            extract_headers,
            job_of,
            prepare_extraction,
            run_blocking,
        )

        if extract.request_id is None:
            trans_id = req.environ.get("swift.trans_id")
            if trans_id:
                extract = extract.model_copy(update={"request_id": str(trans_id)})
        # Shared features only after the caller's own HEADs through the pipeline (the core's).
        prep = run_blocking(prepare_extraction(rt, extract, host.account), host.perform)
        if isinstance(prep, SharedExtraction):
            headers = extract_headers(
                prep.request_id, prep.device, prep.batch_size, prep.features.count
            )
            headers[HEADER_EXECUTION] = Execution.IN_PROXY.value
            req.environ["eventlet.minimum_write_chunk_size"] = 0
            return Response(
                status=200,
                app_iter=_SharedFrameStream(
                    rt, prep, self._slots.release, self.config.send_timeout
                ),
                content_type=CONTENT_TYPE_FRAMES,
                headers=headers,
            )
        try:
            job = job_of(rt, prep)
            headers = extract_headers(
                prep.request_id, job.device.name, job.batch_size, len(prep.images)
            )
        except BaseException:
            prep.stream_started = False
            abandon(rt, prep)
            raise
        headers[HEADER_EXECUTION] = Execution.IN_PROXY.value
        # eventlet.wsgi buffers writes below 4 KiB; frames should leave as soon as they exist.
        req.environ["eventlet.minimum_write_chunk_size"] = 0
        return Response(
            status=200,
            app_iter=_FrameStream(
                rt, prep, job, self._slots.release, self.logger, self.config.send_timeout
            ),
            content_type=CONTENT_TYPE_FRAMES,
            headers=headers,
        )


def _validate(body: dict[str, object], schema: type[ExtractRequest]) -> Any:
    """``body`` as ``schema`` (the HAPI server's 422 ``invalid_request`` otherwise)."""
    from hapi_core import validation_detail

    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise InvalidRequestError(validation_detail(exc.errors())) from None
