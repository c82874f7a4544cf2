"""The gradient side channel: TCP between the workers and the trusted aggregator (rank 0).

Why not torch.distributed point-to-point: Garfield's ``get_gradients(t, q)`` returns the
fastest ``q`` of ``n`` gradients, so the aggregator must stop waiting for the others. With gloo,
a posted ``irecv`` cannot be cancelled, ``Work.is_completed()`` stays False for point-to-point
receives until ``wait()`` is called, and ``wait(timeout)`` closes the pair for good on expiry;
with NCCL a receive that never completes trips the watchdog. A plain TCP connection per worker,
read through :mod:`selectors` against a deadline, gives exactly the needed semantics: replies
are taken in arrival order, a silent worker costs nothing after the deadline, and a reply that
arrives for a round already closed is recognised by its round number and discarded.

torch.distributed still does the rest (rendezvous, the channel's address and token, the
initial parameter broadcast, the per-epoch checks), see :mod:`.trainer`.

Dead peers: a link cut leaves a half-open connection that no read or write notices by itself.
Every channel socket has TCP keepalive (``SO_KEEPALIVE`` with ``TCP_KEEPIDLE``,
``TCP_KEEPINTVL``, ``TCP_KEEPCNT``) and ``TCP_USER_TIMEOUT`` set by :class:`Keepalive` so that
the kernel declares a silent peer dead within a given time (the run's gather timeout, see
:attr:`.DistributedConfig.keepalive_s`), whether the socket is idle or has data in flight; the
read or write then fails as a :class:`ChannelError`. A worker's wait for an update is also
bounded by :attr:`.DistributedConfig.update_timeout_s`, derived from the gather timeout.

Trust: the aggregator is trusted; workers may be Byzantine. A connection proves it belongs to
the run with a random token the aggregator handed out over torch.distributed; a worker that
sends a malformed frame, impersonates another rank or stops reading is disconnected and simply
never counts as a reply again.
"""

from __future__ import annotations

import hmac
import logging
import selectors
import socket
import time
from dataclasses import dataclass, field
from types import TracebackType

from .addresses import is_literal as _is_literal
from .addresses import is_loopback_host, resolve_host
from .errors import ChannelError, GatherTimeoutError
from .messages import (
    ENVELOPE,
    PROTOCOL_VERSION,
    FrameBuffer,
    FrameKind,
    GradientMessage,
    Hello,
    UpdateMessage,
)

__all__ = ["AggregatorChannel", "GatherResult", "Keepalive", "WorkerChannel"]

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Keepalive:
    """TCP keepalive of a channel socket: a peer that stops answering is declared dead after
    ``idle_s + interval_s * count`` seconds without an answer (:attr:`detect_s`).

    The kernel sends the first probe after ``idle_s`` seconds without traffic, then one every
    ``interval_s`` seconds; ``count`` unanswered probes close the connection, and so does data
    left unacknowledged for :attr:`detect_s` (``TCP_USER_TIMEOUT``, where the system has it).
    """

    idle_s: int
    interval_s: int
    count: int

    #: Probes sent before a silent peer is declared dead (a lost probe or two is no verdict).
    PROBES = 4

    @classmethod
    def within(cls, seconds: float) -> Keepalive:
        """Settings that declare a silent peer dead within ``seconds`` (at least 2 s: the
        kernel counts whole seconds): about half of it idle, the other half ``PROBES`` probes
        (fewer when ``seconds`` is too short for them at one per second)."""
        total = max(2, int(seconds))
        count = max(1, min(cls.PROBES, total // 2))
        interval = max(1, total // (2 * count))
        return cls(idle_s=max(1, total - interval * count), interval_s=interval, count=count)

    @property
    def detect_s(self) -> int:
        return self.idle_s + self.interval_s * self.count

    def apply(self, sock: socket.socket) -> None:
        """Turn keepalive on for ``sock`` with these settings (the options this system has)."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", self.idle_s),
            ("TCP_KEEPINTVL", self.interval_s),
            ("TCP_KEEPCNT", self.count),
            ("TCP_USER_TIMEOUT", self.detect_s * 1000),  # milliseconds
        ):
            option = getattr(socket, name, None)
            if option is not None:  # Linux has all four; others some (macOS: no USER_TIMEOUT)
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


#: Keepalive when none is given: a dead peer within a minute.
DEFAULT_KEEPALIVE = Keepalive.within(60.0)


@dataclass
class GatherResult:
    """What :meth:`AggregatorChannel.gather` collected for one round."""

    round_index: int
    replies: list[GradientMessage]
    """The fastest ``q`` replies that carry a gradient, in arrival order."""
    received: dict[int, GradientMessage] = field(default_factory=dict)
    """Every reply of this round read before returning, by rank (beyond ``q`` too)."""
    seconds: float = 0.0
    stale: int = 0
    """Replies of earlier rounds that arrived late and were discarded."""
    rejected: int = 0
    """Replies ignored as malformed (wrong size, duplicate, a round from the future)."""


@dataclass
class _Peer:
    rank: int
    sock: socket.socket
    buffer: FrameBuffer


class AggregatorChannel:
    """Rank 0's end: listens, authenticates ``world_size - 1`` workers, gathers, sends updates.

    ``host`` is the address to bind; ``""`` binds every interface (IPv6 and IPv4 where the
    system can, else IPv4); :mod:`.addresses` says which one a run uses.
    """

    def __init__(
        self,
        world_size: int,
        token: bytes,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        io_timeout_s: float = 60.0,
        max_frame_bytes: int = 1 << 31,
        keepalive: Keepalive = DEFAULT_KEEPALIVE,
    ) -> None:
        self.world_size = world_size
        self._token = token
        self.io_timeout_s = io_timeout_s
        self.keepalive = keepalive
        self.max_frame_bytes = max_frame_bytes
        self._listener = _listen(host, port, backlog=max(8, world_size))
        self._selector = selectors.DefaultSelector()
        self._peers: dict[int, _Peer] = {}
        self.disconnected: dict[int, str] = {}

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def connected(self) -> list[int]:
        return sorted(self._peers)

    def connection(self, rank: int) -> socket.socket:
        """The connection to worker ``rank`` (e.g. to read its options)."""
        return self._peers[rank].sock

    def accept(self, timeout_s: float) -> None:
        """Wait until every worker (ranks 1..world_size-1) has connected and said hello."""
        deadline = time.monotonic() + timeout_s
        expected = set(range(1, self.world_size))
        while set(self._peers) != expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(expected - set(self._peers))
                raise ChannelError(
                    f"workers {missing} did not connect to the aggregator within {timeout_s:.0f} s"
                )
            self._listener.settimeout(remaining)
            try:
                conn, addr = self._listener.accept()
            except TimeoutError:
                continue
            self._greet(conn, addr, min(remaining, self.io_timeout_s))

    def _greet(self, conn: socket.socket, addr: object, timeout_s: float) -> None:
        try:
            conn.settimeout(timeout_s)
            head = _recv_exact(conn, ENVELOPE.size)
            magic, kind, length = ENVELOPE.unpack(head)
            if kind != FrameKind.HELLO or length > 1024:
                raise ChannelError(f"expected HELLO, got frame kind {kind}")
            buffer = FrameBuffer(self.max_frame_bytes)
            buffer.feed(head + _recv_exact(conn, length))
            frame = buffer.pop()
            assert frame is not None
            hello = Hello.decode(frame[1])
        except (OSError, ChannelError) as exc:
            log.warning("rejected a side-channel connection from %s: %s", addr, exc)
            conn.close()
            return
        problem = None
        if hello.version != PROTOCOL_VERSION:
            problem = f"protocol version {hello.version}, expected {PROTOCOL_VERSION}"
        elif not hmac.compare_digest(hello.token, self._token):
            problem = "wrong token"
        elif hello.world_size != self.world_size or not 1 <= hello.rank < self.world_size:
            problem = (
                f"rank {hello.rank} of {hello.world_size} does not fit a world of {self.world_size}"
            )
        elif hello.rank in self._peers:
            problem = f"rank {hello.rank} is already connected"
        if problem is not None:
            log.warning("rejected a side-channel connection from %s: %s", addr, problem)
            conn.close()
            return
        conn.settimeout(self.io_timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.keepalive.apply(conn)
        peer = _Peer(hello.rank, conn, FrameBuffer(self.max_frame_bytes))
        self._peers[hello.rank] = peer
        self._selector.register(conn, selectors.EVENT_READ, peer)
        log.debug("worker %d connected from %s", hello.rank, addr)

    def _drop(self, peer: _Peer, reason: str) -> None:
        log.warning("disconnecting worker %d: %s", peer.rank, reason)
        self.disconnected[peer.rank] = reason
        self._peers.pop(peer.rank, None)
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        peer.sock.close()

    def gather(
        self,
        round_index: int,
        q: int,
        timeout_s: float,
        own: GradientMessage | None = None,
        *,
        numel: int | None = None,
    ) -> GatherResult:
        """Garfield's ``get_gradients(t, q)``: the fastest ``q`` gradients of round ``round_index``.

        ``own`` is the aggregator's own reply (it is also worker 0); it arrives first. Raises
        :class:`GatherTimeoutError` when fewer than ``q`` gradients arrived within ``timeout_s``.
        Gradients whose element count differs from ``numel`` are ignored.
        """
        start = time.monotonic()
        deadline = start + timeout_s
        result = GatherResult(round_index, [])
        if own is not None:
            self._accept_reply(own, result, numel)
        for known in list(self._peers.values()):
            self._parse(known, result, numel)
        while len(result.replies) < q:
            remaining = deadline - time.monotonic()
            # Disconnected workers never reply: fail now rather than at the deadline.
            possible = len(result.replies) + sum(1 for r in self._peers if r not in result.received)
            if remaining <= 0 or possible < q:
                silent = [r for r in range(self.world_size) if r not in result.received]
                raise GatherTimeoutError(
                    f"round {round_index}: {len(result.replies)} of q={q} gradients after "
                    f"{time.monotonic() - start:.1f} s; no reply from ranks {silent}"
                    + (f"; disconnected: {self.disconnected}" if self.disconnected else ""),
                    round_index=round_index,
                    received=len(result.replies),
                    q=q,
                )
            for key, _ in self._selector.select(remaining):
                peer: _Peer = key.data
                try:
                    chunk = peer.sock.recv(_CHUNK)
                except (BlockingIOError, InterruptedError, TimeoutError):
                    continue
                except OSError as exc:
                    self._drop(peer, f"read failed: {exc}")
                    continue
                if not chunk:
                    self._drop(peer, "closed the connection")
                    continue
                peer.buffer.feed(chunk)
                self._parse(peer, result, numel)
        result.replies = result.replies[:q]
        result.seconds = time.monotonic() - start
        return result

    def _parse(self, peer: _Peer, result: GatherResult, numel: int | None) -> None:
        while peer.rank in self._peers:
            try:
                frame = peer.buffer.pop()
                if frame is None:
                    return
                kind, body = frame
                if kind != FrameKind.GRADIENT:
                    raise ChannelError(f"sent a {kind.name} frame to the aggregator")
                msg = GradientMessage.decode(body)
            except ChannelError as exc:
                self._drop(peer, str(exc))
                return
            if msg.rank != peer.rank:
                self._drop(peer, f"claimed to be rank {msg.rank}")
                return
            if msg.round_index < result.round_index:
                result.stale += 1
                continue
            self._accept_reply(msg, result, numel)

    def _accept_reply(self, msg: GradientMessage, result: GatherResult, numel: int | None) -> None:
        if msg.round_index > result.round_index or msg.rank in result.received:
            log.warning(
                "ignoring a reply of worker %d for round %d while gathering round %d%s",
                msg.rank,
                msg.round_index,
                result.round_index,
                " (duplicate)" if msg.rank in result.received else "",
            )
            result.rejected += 1
            return
        result.received[msg.rank] = msg
        if msg.gradient is None:
            return
        if numel is not None and msg.gradient.numel() != numel:
            log.warning(
                "ignoring worker %d's gradient of %d elements (expected %d)",
                msg.rank,
                msg.gradient.numel(),
                numel,
            )
            result.rejected += 1
            return
        result.replies.append(msg)

    def send_update(self, update: UpdateMessage) -> None:
        """Send ``update`` to every connected worker; one that cannot take it is disconnected."""
        data = update.encode()
        for peer in list(self._peers.values()):
            try:
                peer.sock.sendall(data)
            except OSError as exc:
                self._drop(peer, f"could not take the update of round {update.round_index}: {exc}")

    def close(self) -> None:
        for peer in list(self._peers.values()):
            peer.sock.close()
        self._peers.clear()
        self._selector.close()
        self._listener.close()

    def __enter__(self) -> AggregatorChannel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class WorkerChannel:
    """A worker's end: connects to the aggregator, sends gradients, reads updates in order."""

    def __init__(
        self,
        address: tuple[str, int],
        rank: int,
        world_size: int,
        token: bytes,
        *,
        connect_timeout_s: float = 60.0,
        io_timeout_s: float = 60.0,
        max_frame_bytes: int = 1 << 31,
        keepalive: Keepalive = DEFAULT_KEEPALIVE,
    ) -> None:
        self.rank = rank
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                self._sock = socket.create_connection(address, timeout=io_timeout_s)
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise ChannelError(
                        f"worker {rank} cannot reach the aggregator at {address}"
                        f"{_resolved_here(address[0])}: {exc}"
                    ) from exc
                time.sleep(0.05)  # retry pacing while the aggregator starts listening
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        keepalive.apply(self._sock)
        self._buffer = FrameBuffer(max_frame_bytes)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._send(Hello(rank, world_size, token).encode())

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise ChannelError(f"worker {self.rank} lost the aggregator: {exc}") from exc

    def send(self, msg: GradientMessage) -> None:
        self._send(msg.encode())

    def _read_available(self, timeout_s: float) -> None:
        if not self._selector.select(timeout_s):
            return
        try:
            chunk = self._sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return
        except OSError as exc:
            raise ChannelError(f"worker {self.rank} lost the aggregator: {exc}") from exc
        if not chunk:
            raise ChannelError(f"the aggregator closed worker {self.rank}'s connection")
        self._buffer.feed(chunk)

    def _pop_update(self) -> UpdateMessage | None:
        frame = self._buffer.pop()
        if frame is None:
            return None
        kind, body = frame
        if kind != FrameKind.UPDATE:
            raise ChannelError(f"the aggregator sent a {kind.name} frame")
        return UpdateMessage.decode(body)

    def poll_update(self) -> UpdateMessage | None:
        """The next update if it has fully arrived already, else None (never blocks)."""
        update = self._pop_update()
        while update is None:
            before = len(self._buffer)
            self._read_available(0.0)
            if len(self._buffer) == before:
                return None
            update = self._pop_update()
        return update

    @property
    def connection(self) -> socket.socket:
        """The connection to the aggregator (e.g. to read its options)."""
        return self._sock

    def recv_update(self, timeout_s: float) -> UpdateMessage:
        """The next update; raises :class:`ChannelError` after ``timeout_s`` without one (a
        trainer passes :attr:`.DistributedConfig.update_timeout_s`), or as soon as keepalive
        declares the aggregator dead."""
        deadline = time.monotonic() + timeout_s
        update = self._pop_update()
        while update is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelError(
                    f"worker {self.rank} got no update from the aggregator within {timeout_s:.0f} s"
                )
            self._read_available(remaining)
            update = self._pop_update()
        return update

    def close(self) -> None:
        self._selector.close()
        self._sock.close()

    def __enter__(self) -> WorkerChannel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _listen(host: str, port: int, *, backlog: int) -> socket.socket:
    if host:
        return socket.create_server((host, port), backlog=backlog)
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(
                ("::", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True
            )
        except OSError:  # IPv6 compiled in but off on this host
            pass
    return socket.create_server(("0.0.0.0", port), backlog=backlog)  # noqa: S104


def _resolved_here(host: str) -> str:
    """`` (NAME resolves here to ...)`` for a name, so a wrong /etc/hosts entry shows."""
    if is_loopback_host(host) or _is_literal(host):
        return ""
    found = resolve_host(host)
    return f" ({host} resolves here to {', '.join(found) if found else 'nothing'})"


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ChannelError("connection closed during the handshake")
        out += chunk
    return bytes(out)
