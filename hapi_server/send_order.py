"""One client pipeline's responses go out oldest first: what it needs next reaches it first.

A client keeps several shards in flight so that the link never idles while it trains
(``hapi_client.pipeline``), and it consumes them in the order it asked for them. Sent side by
side, two responses share the link: both arrive at the end of both, the client waits for the
older one as long as the two took, then trains both back to back. In a link-bound epoch that
costs an idle link whenever the one left in flight is nearly sent when the next is asked for,
and at the end of an epoch a training step the wire could have hidden (the demo at 6 Mbit/s:
shards of 1.2 MB arriving in the wrong order, its steady pipeline at 1.08x the wire's time).

So the responses of one pipeline (a client's ``X-Hapi-Pipeline`` header, within one account)
are sent in the order the client asked for them (its ``X-Hapi-Pipeline-Seq``; without it, the
order they arrived in): a response's frame waits while an older one of its pipeline is
sending, i.e. inside a send or within ``quiet_s`` of its last one. Never at the link's cost: an
older response whose server is still computing (quiet) does not hold a younger one that has a
frame, and no frame waits more than ``max_wait_s`` in all. A younger response that went first
gives the link back when the older one has a frame: its frames go out in pieces
(:data:`PIECE_BYTES` at the most), each of which waits its turn. A frame the server has handed
to the kernel is not yet on the wire: ``HAPI_SEND_LOWAT_BYTES`` (``TCP_NOTSENT_LOWAT``, the
technique HTTP/2 servers use to make stream priorities hold) keeps what a socket holds unsent
small, so "sent" means on its way.

The client's own order matters where requests are asked together: a client filling its
pipeline asks for three shards at once, each on a connection of its own, and they reached the
server in any order (the demo's first batch came at 4.6 s instead of 2.4 s when the third
shard was taken for the oldest; the oracle's EfficientNet-Lite0 epochs at split 8 waited 5.1-5.5 s
for their first batch, at split 9 2.0-3.0 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable

__all__ = ["PIECE_BYTES", "SendOrder", "SendTurn"]

#: The most of a frame sent at once where its pipeline has other responses open: a younger
#: response's frame of 1.2 MB (a COS batch of 50 EfficientNet-Lite0 features) sent whole held
#: the link for a second at 10 Mbit/s after the older one had its frame ready.
PIECE_BYTES = 128 << 10


class SendTurn:
    """One response's place in its pipeline's order (:meth:`SendOrder.open`)."""

    def __init__(self, key: tuple[str, str], seq: int) -> None:
        self.key = key
        self.seq = seq
        self.sending = False
        self.last_sent: float | None = None
        self.waited_s = 0.0

    def busy(self, now: float, quiet_s: float) -> bool:
        return self.sending or (self.last_sent is not None and now - self.last_sent < quiet_s)


class SendOrder:
    """The open responses of every pipeline, oldest first (used on one event loop)."""

    def __init__(
        self,
        *,
        quiet_s: float,
        max_wait_s: float,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        #: Told each closed response's seconds of waiting (a metric).
        self.observe = observe
        self._seq = itertools.count()
        self._open: dict[tuple[str, str], list[SendTurn]] = {}
        self._changed = asyncio.Condition()
        # The loop keeps only weak references to tasks: the notifications in flight are held.
        self._notifying: set[asyncio.Task[None]] = set()

    def open(self, account: str, pipeline: str, asked: int | None = None) -> SendTurn:
        """A place among the pipeline's open responses: the client's ``asked`` (its order; a
        pipeline gives it for all its requests or for none), else behind those open. Take it
        when the request arrives, :meth:`close` it when its response ends, however."""
        turn = SendTurn((account, pipeline), next(self._seq) if asked is None else asked)
        self._open.setdefault(turn.key, []).append(turn)
        return turn

    def close(self, turn: SendTurn) -> None:
        group = self._open.get(turn.key, [])
        if turn in group:
            group.remove(turn)
            if group:
                self._wake()  # the younger ones may be waiting for this one
            else:
                del self._open[turn.key]
            if self.observe is not None:
                self.observe(turn.waited_s)

    def _wake(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        # Called from synchronous code on the loop: notify from a task of its own.
        task = asyncio.get_running_loop().create_task(notify())
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    def _older_busy_until(self, turn: SendTurn) -> float | None:
        """None when no older response of the pipeline is sending; else when to look again."""
        now = time.monotonic()
        group = self._open.get(turn.key, [])
        older = [t for t in group if t.seq < turn.seq and t.busy(now, self.quiet_s)]
        if not older:
            return None
        if any(t.sending for t in older):
            return now + self.quiet_s
        return max(t.last_sent or now for t in older) + self.quiet_s

    async def before_send(self, turn: SendTurn) -> None:
        """Wait while an older response of the pipeline is sending (at most ``max_wait_s`` in
        all for this response), then mark this one sending."""
        began = time.monotonic()
        waited = 0.0
        while True:
            until = self._older_busy_until(turn)
            left = self.max_wait_s - turn.waited_s - waited
            if until is None or left <= 0:
                break
            # An older response that sends again only moves ``until`` on: wake then, or when
            # one sent or ended, and look again.
            with contextlib.suppress(TimeoutError):
                async with self._changed:
                    await asyncio.wait_for(
                        self._changed.wait(), max(0.0, min(left, until - time.monotonic()))
                    )
            waited = time.monotonic() - began
        turn.waited_s += waited
        turn.sending = True

    def shared(self, turn: SendTurn) -> bool:
        """Whether another response of ``turn``'s pipeline is open (its frames then go out in
        pieces, so that an older one takes the link back between them)."""
        return len(self._open.get(turn.key, ())) > 1

    def after_send(self, turn: SendTurn) -> None:
        turn.sending = False
        turn.last_sent = time.monotonic()
        # Only another response of the pipeline can be waiting: a lone one's frames cost no task.
        if self.shared(turn):
            self._wake()
