"""Unit tests of how an extraction gives its memory back when the response ends early.

``test_server_queue.py`` shows the end-to-end effect over HTTP; these pin the two mechanisms
down without timing: a response whose body never starts still calls its ``on_close``, and
``abandon``/``finish`` release exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from starlette.requests import ClientDisconnect

from hapi_core.adaptation import DeviceScheduler
from hapi_core.devices import Device
from hapi_core.metrics import Metrics
from hapi_core.solver import Demand
from hapi_server import ServerSettings
from hapi_server.core_host import abandon, finish
from hapi_server.routers.extract import _ReleasingStreamingResponse

from .server_helpers import prepared_extraction

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_on_close_runs_when_the_body_never_starts() -> None:
    started: list[bool] = []
    closed: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        started.append(True)
        yield b"never sent"

    response = _ReleasingStreamingResponse(
        body(), on_close=lambda: closed.append(True), send_timeout_s=60
    )

    async def send(message: Any) -> None:
        raise OSError("the client is gone")  # what an ASGI 2.4 server does on a dead socket

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
    with pytest.raises(ClientDisconnect):
        await response(scope, receive, send)
    assert closed == [True] and started == []


async def test_a_client_that_takes_no_frame_is_cut_off_and_released() -> None:
    """A send that never completes (the client's socket stays full) ends the response after
    send_timeout_s: on_close runs and the body is closed, with no exception to the server."""
    closed: list[bool] = []
    finished: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"a"
            yield b"b"
        finally:
            finished.append(True)

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()  # a reader that never reads

    async def receive() -> Any:
        await asyncio.Event().wait()  # no disconnect either
        raise AssertionError("unreachable")

    response = _ReleasingStreamingResponse(
        body(), on_close=lambda: closed.append(True), send_timeout_s=0.05
    )
    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    assert closed == [True] and finished == [True]


async def test_on_close_runs_and_the_body_is_closed_after_a_normal_end() -> None:
    closed: list[bool] = []
    finished: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"a"
            yield b"b"
        finally:
            finished.append(True)

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        await asyncio.Event().wait()  # no disconnect
        raise AssertionError("unreachable")

    response = _ReleasingStreamingResponse(
        body(), on_close=lambda: closed.append(True), send_timeout_s=60
    )
    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    assert [m.get("body") for m in sent[1:]] == [b"a", b"b", b""]
    assert closed == [True] and finished == [True]


async def test_abandon_releases_once_and_only_an_unstarted_stream() -> None:
    settings = ServerSettings(_env_file=None, framework_reserve_bytes=0, b_min=1)  # type: ignore[call-arg]
    scheduler = DeviceScheduler(Device("cpu", 100_000), settings, Metrics())
    reservation = await scheduler.acquire(Demand("r1", 1_000, 0, 1, 100, 0.0))
    assert scheduler.free_bytes() == 0

    state, prep = prepared_extraction(scheduler, reservation)
    prep.stream_started = True
    abandon(cast(Any, state), prep)  # the stream owns the release: nothing happens here
    assert scheduler.free_bytes() == 0 and state.weights.released == 0

    prep.stream_started = False
    abandon(cast(Any, state), prep)
    abandon(cast(Any, state), prep)
    finish(cast(Any, state), prep, "200")
    assert scheduler.free_bytes() == 100_000 and state.weights.released == 1
    requests = scheduler.metrics.registry.get_sample_value(
        "hapi_requests_total", {"endpoint": "extract", "status": "499"}
    )
    assert requests == 1
