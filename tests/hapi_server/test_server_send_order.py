"""One client pipeline's responses are sent oldest first (hapi_server.send_order)."""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import AsyncIterator
from typing import Any

from hapi_server.main import listening_socket
from hapi_server.routers.extract import _ReleasingStreamingResponse
from hapi_server.send_order import PIECE_BYTES, SendOrder, SendTurn
from hapi_server.settings import ServerSettings

ACCOUNT = "http://swift/v1/AUTH_test"


async def _yield(times: int = 20) -> None:
    # Lets the other tasks run; a yield to the loop, not a wait for time to pass.
    for _ in range(times):
        await asyncio.sleep(0)


def test_a_younger_response_waits_while_an_older_one_of_its_pipeline_sends() -> None:
    async def scenario() -> tuple[SendTurn, list[float]]:
        waits: list[float] = []
        order = SendOrder(quiet_s=60.0, max_wait_s=60.0, observe=waits.append)
        older, younger = order.open(ACCOUNT, "p"), order.open(ACCOUNT, "p")
        await order.before_send(older)  # the older one is sending (a full socket, say)
        task = asyncio.create_task(order.before_send(younger))
        await _yield()
        assert not task.done()
        order.after_send(older)  # sent; it stays busy for quiet_s, i.e. until it ends
        await _yield()
        assert not task.done()
        order.close(older)
        await asyncio.wait_for(task, 10)
        order.after_send(younger)
        order.close(younger)
        return younger, waits

    younger, waits = asyncio.run(scenario())
    assert younger.waited_s > 0
    assert waits == [0.0, younger.waited_s]


def test_what_does_not_hold_a_response() -> None:
    async def scenario() -> list[float]:
        order = SendOrder(quiet_s=60.0, max_wait_s=60.0)
        older = order.open(ACCOUNT, "p")
        other_pipeline = order.open(ACCOUNT, "q")
        other_account = order.open("http://swift/v1/AUTH_other", "p")
        younger = order.open(ACCOUNT, "p")
        waited = []
        # An older response still computing (nothing sent yet) holds no younger one.
        await order.before_send(younger)
        waited.append(younger.waited_s)
        order.after_send(younger)
        # A younger response that sends never holds an older one, nor does another pipeline's.
        await order.before_send(older)
        waited.append(older.waited_s)
        await order.before_send(other_pipeline)
        await order.before_send(other_account)
        waited += [other_pipeline.waited_s, other_account.waited_s]
        for turn in (older, other_pipeline, other_account, younger):
            order.after_send(turn)
            order.close(turn)
        return waited

    assert asyncio.run(scenario()) == [0.0, 0.0, 0.0, 0.0]


def test_a_response_waits_at_most_max_wait_s_in_all() -> None:
    async def scenario() -> tuple[float, float]:
        order = SendOrder(quiet_s=60.0, max_wait_s=0.2)
        older, younger = order.open(ACCOUNT, "p"), order.open(ACCOUNT, "p")
        await order.before_send(older)  # and never done: a client that stopped reading
        await asyncio.wait_for(order.before_send(younger), 10)
        first = younger.waited_s
        order.after_send(younger)
        await asyncio.wait_for(order.before_send(younger), 10)  # its budget is spent
        return first, younger.waited_s - first

    first, second = asyncio.run(scenario())
    assert first >= 0.19 and second < 0.19


def test_an_older_response_that_turned_quiet_releases_the_younger_one() -> None:
    async def scenario() -> float:
        order = SendOrder(quiet_s=0.05, max_wait_s=60.0)
        older, younger = order.open(ACCOUNT, "p"), order.open(ACCOUNT, "p")
        await order.before_send(older)
        order.after_send(older)  # its next frame is still being computed
        await asyncio.wait_for(order.before_send(younger), 10)
        return younger.waited_s

    assert asyncio.run(scenario()) < 60.0


def test_a_younger_responses_frames_leave_after_the_older_ones() -> None:
    """Two responses of one pipeline over ASGI: while the older's frame sits in a full socket,
    the younger's frames are not sent; they leave once the older one ends."""

    async def scenario() -> list[str]:
        order = SendOrder(quiet_s=60.0, max_wait_s=60.0)
        older, younger = order.open(ACCOUNT, "p"), order.open(ACCOUNT, "p")
        socket_drained = asyncio.Event()
        sent: list[str] = []

        def body(name: str) -> AsyncIterator[bytes]:
            async def frames() -> AsyncIterator[bytes]:
                yield f"{name}-frame".encode()

            return frames()

        def send_of(name: str) -> Any:
            async def send(message: Any) -> None:
                if message.get("body"):
                    if name == "older":
                        await socket_drained.wait()  # a full socket until released
                    sent.append(message["body"].decode())

            return send

        async def receive() -> Any:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        responses = [
            _ReleasingStreamingResponse(
                body(name),
                on_close=lambda t=turn: order.close(t),
                send_timeout_s=60,
                order=(order, turn),
            )
            for name, turn in (("older", older), ("younger", younger))
        ]
        tasks = [
            asyncio.create_task(r(scope, receive, send_of(name)))
            for r, name in zip(responses, ("older", "younger"), strict=True)
        ]
        await _yield()
        assert sent == []  # the older one's frame is stuck, the younger one's waits
        socket_drained.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return sent

    assert asyncio.run(scenario()) == ["older-frame", "younger-frame"]


def test_the_clients_order_beats_the_arrival_order() -> None:
    """Requests asked together race to the server on connections of their own: the place is the
    client's (``X-Hapi-Pipeline-Seq``), not the arrival's."""

    async def scenario() -> tuple[bool, float]:
        order = SendOrder(quiet_s=60.0, max_wait_s=60.0)
        second = order.open(ACCOUNT, "p", asked=1)  # arrived first
        first = order.open(ACCOUNT, "p", asked=0)
        await order.before_send(first)  # the client's first holds the second...
        task = asyncio.create_task(order.before_send(second))
        await _yield()
        held = not task.done()
        order.after_send(first)
        order.close(first)
        await asyncio.wait_for(task, 10)
        return held, first.waited_s  # ...and never waits for it

    assert asyncio.run(scenario()) == (True, 0.0)


def _asgi_send(log: list[tuple[str, int]], name: str, blocked: asyncio.Event | None) -> Any:
    """An ASGI send that logs each body piece when handed over; ``blocked``: a full socket
    until set, for the first piece."""

    async def send(message: Any) -> None:
        if message.get("body"):
            log.append((name, len(message["body"])))
            assert message["more_body"]  # a frame's pieces, then the end of the body
            if blocked is not None and not blocked.is_set():
                await blocked.wait()

    return send


async def _never_disconnects() -> Any:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def test_a_younger_frame_goes_in_pieces_and_gives_the_link_back() -> None:
    """A younger response that went first (the older one still computing) sends its frame in
    pieces: once the older one sends, the younger's next piece waits for it."""

    async def scenario() -> list[tuple[str, int]]:
        order = SendOrder(quiet_s=60.0, max_wait_s=60.0)
        older, younger = order.open(ACCOUNT, "p"), order.open(ACCOUNT, "p")
        computed, socket_drained = asyncio.Event(), asyncio.Event()
        log: list[tuple[str, int]] = []

        async def older_frames() -> AsyncIterator[bytes]:
            await computed.wait()
            yield b"o" * 1000

        async def younger_frames() -> AsyncIterator[bytes]:
            yield b"y" * (3 * PIECE_BYTES)

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        runs = [
            _ReleasingStreamingResponse(
                frames,
                on_close=functools.partial(order.close, turn),
                send_timeout_s=60,
                order=(order, turn),
            )(scope, _never_disconnects, send)
            for frames, turn, send in (
                (older_frames(), older, _asgi_send(log, "older", None)),
                (younger_frames(), younger, _asgi_send(log, "younger", socket_drained)),
            )
        ]
        tasks = [asyncio.create_task(run) for run in runs]
        await _yield()
        assert log == [("younger", PIECE_BYTES)]  # the older one computes: the link is used
        computed.set()
        await _yield()
        socket_drained.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return log

    assert asyncio.run(scenario()) == [
        ("younger", PIECE_BYTES),
        ("older", 1000),
        ("younger", PIECE_BYTES),
        ("younger", PIECE_BYTES),
    ]


def test_a_response_alone_in_its_pipeline_sends_its_frame_whole() -> None:
    async def scenario() -> list[tuple[str, int]]:
        order = SendOrder(quiet_s=60.0, max_wait_s=60.0)
        turn = order.open(ACCOUNT, "p")
        log: list[tuple[str, int]] = []

        async def frames() -> AsyncIterator[bytes]:
            yield b"x" * (3 * PIECE_BYTES)

        response = _ReleasingStreamingResponse(
            frames(), on_close=lambda: order.close(turn), send_timeout_s=60, order=(order, turn)
        )
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        await response(scope, _never_disconnects, _asgi_send(log, "alone", None))
        return log

    assert asyncio.run(scenario()) == [("alone", 3 * PIECE_BYTES)]


def test_the_listening_socket_keeps_little_unsent() -> None:

    option = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
    for lowat in (64 * 1024, 0):
        with socket.create_server(("127.0.0.1", 0)) as probe:
            port = probe.getsockname()[1]
        settings = ServerSettings(host="127.0.0.1", port=port, send_lowat_bytes=lowat)
        sock = listening_socket(settings)
        try:
            assert sock.getsockopt(socket.IPPROTO_TCP, option) == lowat
        finally:
            sock.close()
