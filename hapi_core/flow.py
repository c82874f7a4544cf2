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
    "ReadWindow",
    "Reserve",
    "StoredObject",
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
    data: bytes | bytearray
    """The body as it was read: a ``bytearray`` is handed on, never copied into ``bytes``
    (a 988 MB shard would be held twice), and only read."""
    etag: str


@dataclass(frozen=True)
class Head:
    """Authorise a read of ``container/obj`` as the caller; the answer is its :class:`ObjectInfo`."""

    container: str
    obj: str


@dataclass(frozen=True)
class Get:
    """Read ``container/obj`` as the caller, at most ``max_bytes`` (413 over); a
    :class:`StoredObject`. With ``tail``, only the object's last ``tail`` bytes (an HTTP suffix
    range: all of it when it is shorter)."""

    container: str
    obj: str
    max_bytes: int
    tail: int = 0


@dataclass(frozen=True)
class GetMany:
    """Read each of ``objs`` in ``container`` as the caller, each at most ``max_bytes_each``
    (413 over), at most ``concurrency`` at once; their :class:`StoredObject` in the order of
    ``objs``. At the first refusal (401, 403, 404, 413...) no more reads start, and it is raised
    once those in flight have finished (:class:`ReadWindow`, the one policy both hosts keep).

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


class ReadWindow:
    """Which reads of a :class:`GetMany` to start, and its outcome: the policy both hosts keep,
    each driving it with its own concurrency (asyncio tasks, eventlet green threads).

    At most ``concurrency`` reads are in flight, started in order. At the first refusal no more
    start (a part naming 1000 deleted images costs at most that many more requests, not 999),
    and it is raised once the reads in flight have finished: a read stopped midway would not
    stop the proxy's side of its GET, whose container lookup could then write an old ACL back
    into memcached after the caller, refused, has changed it.
    """

    def __init__(self, effect: GetMany) -> None:
        self._count = len(effect.objs)
        self._window = max(1, effect.concurrency)
        self._started = self._finished = 0
        self._results: dict[int, StoredObject] = {}
        self._refusal: BaseException | None = None

    @property
    def open(self) -> bool:
        """Reads are in flight or still to start: the driver waits for the next to finish."""
        return self._finished < self._started or (
            self._refusal is None and self._started < self._count
        )

    def to_start(self) -> range:
        """The indexes (into ``objs``) of the reads to start now; they count as in flight."""
        if self._refusal is not None:
            return range(0)
        first = self._started
        self._started = min(self._count, self._finished + self._window)
        return range(first, self._started)

    def finished(self, index: int, outcome: StoredObject | BaseException) -> None:
        """Read ``index`` ended with ``outcome``: its object, or its refusal."""
        self._finished += 1
        if isinstance(outcome, BaseException):
            self._refusal = self._refusal or outcome
        else:
            self._results[index] = outcome

    def result(self) -> list[StoredObject]:
        """The objects in the order of ``objs``, once closed; the first refusal raised."""
        if self.open:
            raise RuntimeError("the reads of this GetMany have not all finished")
        if self._refusal is not None:
            raise self._refusal
        return [self._results[i] for i in range(self._count)]


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
