"""How an extraction's steps are written once and run by two hosts (a sans-I/O flow).

A flow is a generator: it does every check and decision itself and *yields* what it needs done
(an :data:`Effect`), then receives the result, or the effect's exception thrown in at the
``yield``, so its own ``try``/``finally`` releases what it holds. A host performs the effects
its own way: the HAPI server reads Swift over HTTP as the caller and runs compute in worker
threads from an asyncio loop (:func:`run_async`); the Swift filter's in-proxy execution reads
through the proxy's own pipeline and computes in eventlet's thread pool (:func:`run_blocking`).
So admission, memory planning, model loading and timing exist once, not once per host.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .adaptation import DeviceScheduler
from .solver import Demand

__all__ = [
    "Await",
    "Compute",
    "Effect",
    "Flow",
    "Get",
    "GetMany",
    "Head",
    "ObjectInfo",
    "Reserve",
    "StoredObject",
    "get_many_in_threads",
    "run_async",
    "run_blocking",
]

T = TypeVar("T")


@dataclass(frozen=True)
class ObjectInfo:
    """What a HEAD says about an object: its etag and size (None when Swift gives none)."""

    etag: str
    size: int | None


@dataclass(frozen=True)
class StoredObject:
    data: bytes
    etag: str


@dataclass(frozen=True)
class Head:
    """Authorise a read of ``container/obj`` as the caller; the answer is its :class:`ObjectInfo`."""

    container: str
    obj: str


@dataclass(frozen=True)
class Get:
    """Read ``container/obj`` as the caller, at most ``max_bytes`` (413 over); a
    :class:`StoredObject`."""

    container: str
    obj: str
    max_bytes: int


@dataclass(frozen=True)
class GetMany:
    """Read each of ``objs`` in ``container`` as the caller, each at most ``max_bytes_each``
    (413 over), at most ``concurrency`` at once; their :class:`StoredObject` in the order of
    ``objs``. The first refusal (401, 403, 404, 413...) is raised and the other reads stop.

    One storage request per object, as the thesis' storage requests are: the images of a
    ``folder`` dataset's part (:mod:`hapi_contract.layouts`).
    """

    container: str
    objs: tuple[str, ...]
    max_bytes_each: int
    concurrency: int


@dataclass(frozen=True)
class Compute:
    """Run ``work`` off the host's event loop (it takes CPU or GPU time); its return value."""

    work: Callable[[], Any]


@dataclass(frozen=True)
class Reserve:
    """Wait for ``scheduler`` to plan ``demand`` (see :meth:`DeviceScheduler.submit`); the
    :class:`~hapi_core.adaptation.Reservation`."""

    scheduler: DeviceScheduler
    demand: Demand
    pinned_bytes: int
    refresh: Callable[[Demand], Demand]


class Waitable(Protocol):
    """Something another request settles (:class:`hapi_core.shared_features.Computation`)."""

    def on_settled(self, callback: Callable[[], None]) -> Callable[[], None]: ...

    def outcome(self) -> Any: ...

    def timed_out(self) -> BaseException: ...


@dataclass(frozen=True)
class Await:
    """Wait, holding no thread, at most ``timeout_s`` for ``waitable`` to settle; its
    ``outcome()`` (``timed_out()`` raised past the timeout)."""

    waitable: Waitable
    timeout_s: float


Effect = Head | Get | GetMany | Compute | Reserve | Await
Flow = Generator[Effect, Any, T]


def _resume(flow: Flow[T], ok: bool, value: Any) -> tuple[bool, Any]:
    """Hand the last effect's result (``ok``) or exception to ``flow``: (True, its return value)
    once it returned, else (False, the next effect)."""
    try:
        effect = flow.send(value) if ok else flow.throw(value)
    except StopIteration as stop:
        return True, stop.value
    return False, effect


def get_many_in_threads(
    effect: GetMany, get: Callable[[Get], StoredObject], *, pool: Executor | None = None
) -> list[StoredObject]:
    """Perform ``effect`` with a blocking ``get`` of one object: in ``pool`` (at most
    ``effect.concurrency`` reads submitted at a time), or one after the other without one.

    The first refusal is raised as soon as it happens (not after the reads before it in
    order); the reads not yet started are not made."""
    reads = [Get(effect.container, obj, effect.max_bytes_each) for obj in effect.objs]
    if pool is None or effect.concurrency == 1:
        return [get(read) for read in reads]
    window = max(1, effect.concurrency)
    results: dict[int, StoredObject] = {}
    running: dict[Future[StoredObject], int] = {}
    queued = iter(enumerate(reads))
    try:
        while True:
            while len(running) < window and (item := next(queued, None)) is not None:
                running[pool.submit(get, item[1])] = item[0]
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                results[running.pop(future)] = future.result()
    finally:
        for future in running:
            future.cancel()
    return [results[i] for i in range(len(reads))]


# The two drivers differ only in ``await``: Python cannot write one loop for both.
def run_blocking(flow: Flow[T], perform: Callable[[Effect], Any]) -> T:
    """Run ``flow`` to its end, performing each effect with ``perform``."""
    ok, value = True, None
    while True:
        done, item = _resume(flow, ok, value)
        if done:
            return item  # type: ignore[no-any-return]
        try:
            ok, value = True, perform(item)
        except BaseException as exc:  # noqa: BLE001 - thrown into the flow, which re-raises
            ok, value = False, exc


async def run_async(flow: Flow[T], perform: Callable[[Effect], Awaitable[Any]]) -> T:
    """:func:`run_blocking` for a host on an asyncio loop (a cancellation is thrown in too)."""
    ok, value = True, None
    while True:
        done, item = _resume(flow, ok, value)
        if done:
            return item  # type: ignore[no-any-return]
        try:
            ok, value = True, await perform(item)
        except BaseException as exc:  # noqa: BLE001 - thrown into the flow, which re-raises
            ok, value = False, exc
