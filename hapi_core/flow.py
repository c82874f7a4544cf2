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
from typing import Any, TypeVar

from .adaptation import DeviceScheduler
from .solver import Demand

__all__ = [
    "Compute",
    "Effect",
    "Flow",
    "Get",
    "Head",
    "ObjectInfo",
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


Effect = Head | Get | Compute | Reserve
Flow = Generator[Effect, Any, T]


def _resume(flow: Flow[T], ok: bool, value: Any) -> tuple[bool, Any]:
    """Hand the last effect's result (``ok``) or exception to ``flow``: (True, its return value)
    once it returned, else (False, the next effect)."""
    try:
        effect = flow.send(value) if ok else flow.throw(value)
    except StopIteration as stop:
        return True, stop.value
    return False, effect


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
