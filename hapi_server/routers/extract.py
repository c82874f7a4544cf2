"""``POST /v1/extract``: run a model's head over one shard and stream the features."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from hapi_contract import (
    CONTENT_TYPE_FRAMES,
    EXTRACT_PATH,
    HEADER_PIPELINE,
    HEADER_PIPELINE_SEQ,
    PIPELINE_SEQ_PATTERN,
    ExtractRequest,
)

from .. import core_host, route_docs
from ..deps import CallerDep, StateDep
from ..send_order import PIECE_BYTES, SendOrder, SendTurn

router = APIRouter()

log = logging.getLogger(__name__)


class _ClientStalled(Exception):
    """The client took no frame within the send timeout."""


class _ReleasingStreamingResponse(StreamingResponse):
    """Calls ``on_close`` when the response is over, however it ended.

    Starlette can end a response before it starts the body iterator (sending the status line to
    a client that is gone, a cancelled task group), so the generator's ``finally`` alone cannot
    be trusted to release what the request holds.

    A client that takes no frame for ``send_timeout_s`` is cut off (the filter's
    ``send_timeout``): its body ends there, the server closes the connection, and the
    request's memory and slot are freed instead of waiting on a reader that may never come.

    With a ``turn`` in its client pipeline's :class:`~hapi_server.send_order.SendOrder`, each
    frame first waits while an older response of the pipeline is sending, and goes out in
    pieces while others of the pipeline are open (an older one takes the link back between
    them).
    """

    def __init__(
        self,
        *args: Any,
        on_close: Callable[[], None],
        send_timeout_s: float,
        order: tuple[SendOrder, SendTurn] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close
        self._send_timeout_s = send_timeout_s
        self._order = order

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_one(message: Message) -> None:
            # A body's send waits while the client's socket is full (uvicorn's back-pressure):
            # that wait, and only that one, is what the timeout bounds.
            try:
                async with asyncio.timeout(self._send_timeout_s):
                    await send(message)
            except TimeoutError:
                raise _ClientStalled from None

        async def send_within(message: Message) -> None:
            body = message.get("body")
            if self._order is None or not body:
                await send_one(message)
                return
            order, turn = self._order
            step = PIECE_BYTES if order.shared(turn) else len(body)
            more = bool(message.get("more_body", False))
            for start in range(0, len(body), step):
                await order.before_send(turn)
                try:
                    last = start + step >= len(body)
                    piece = body[start : start + step]
                    await send_one({**message, "body": piece, "more_body": more or not last})
                finally:
                    order.after_send(turn)

        try:
            await super().__call__(scope, receive, send_within)
        except* _ClientStalled:
            log.warning(
                "HAPI stream %s cut off: the client took no frame within %s s (send_timeout_s)",
                self.headers.get("x-hapi-request-id", "?"),
                self._send_timeout_s,
            )
        finally:
            self._on_close()
            # Close a stream left suspended by a disconnect now, not whenever it is collected.
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


# A response class without a media type, so that FastAPI files the ErrorBody answers under
# application/json (see route_docs).
@router.post(
    EXTRACT_PATH, response_class=StreamingResponse, responses=route_docs.extract_responses()
)
async def extract(
    req: ExtractRequest,
    state: StateDep,
    caller: CallerDep,
    pipeline: Annotated[
        str | None,
        Header(
            alias=HEADER_PIPELINE,
            max_length=64,
            description="the client pipeline whose responses are sent in the order asked for",
        ),
    ] = None,
    # A string of digits, not ``int | None``: a header cannot be null, and the schema of an
    # optional integer says it may be (a fuzzer sends the text "null", which is then refused).
    pipeline_seq: Annotated[
        str,
        Header(
            alias=HEADER_PIPELINE_SEQ,
            pattern=PIPELINE_SEQ_PATTERN,
            description="this request's place in its pipeline (the client's order): digits",
        ),
    ] = "",
) -> StreamingResponse:
    """Run layers ``[0, split_index)`` over one shard and stream the features."""
    order = state.send_order
    # The place is taken on arrival, in the client's order where it says it.
    asked = int(pipeline_seq) if pipeline_seq else None
    turn = order.open(caller.storage_url, pipeline, asked) if pipeline else None

    def close() -> None:
        if turn is not None:
            order.close(turn)
        core_host.abandon(state, prep)

    try:
        prep = await core_host.prepare(state, caller, req)
    except BaseException:
        if turn is not None:
            order.close(turn)
        raise
    return _ReleasingStreamingResponse(
        core_host.stream(state, prep),
        on_close=close,
        send_timeout_s=state.settings.send_timeout_s,
        order=(order, turn) if turn is not None else None,
        media_type=CONTENT_TYPE_FRAMES,
        headers=core_host.headers(prep),
    )
