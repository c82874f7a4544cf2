"""The gradient side channel over real loopback TCP: fastest q of n, deadlines, late and bad replies."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest
import torch

from hapi_client.distributed import (
    AggregatorChannel,
    ChannelError,
    DistributedConfig,
    DistributedConfigError,
    GatherTimeoutError,
    GradientMessage,
    Keepalive,
    UpdateMessage,
    WorkerChannel,
)
from hapi_client.distributed.messages import FrameBuffer, Hello

WORLD = 4


def reply(round_index: int, rank: int, *, numel: int = 3, gradient: bool = True) -> GradientMessage:
    return GradientMessage(
        round_index=round_index,
        epoch=0,
        rank=rank,
        samples=4,
        compute_seconds=0.01 * rank,
        memory_used=0.5,
        loss_sum=2.0,
        correct=1,
        wire_bytes=100 * rank,
        requests=rank,
        gradient=torch.full((numel,), float(rank)) if gradient else None,
    )


@pytest.fixture
def channels() -> Iterator[tuple[AggregatorChannel, dict[int, WorkerChannel]]]:
    token = os.urandom(32)
    aggregator = AggregatorChannel(WORLD, token, io_timeout_s=10)
    # Connections complete in the listen backlog; accept() then reads each HELLO.
    workers = {
        r: WorkerChannel(aggregator.address, r, WORLD, token, connect_timeout_s=10)
        for r in range(1, WORLD)
    }
    aggregator.accept(timeout_s=30)
    yield aggregator, workers
    for worker in workers.values():
        worker.close()
    aggregator.close()


def test_fastest_q_without_waiting_for_a_silent_worker(channels) -> None:  # type: ignore[no-untyped-def]
    aggregator, workers = channels
    workers[2].send(reply(1, 2))
    workers[1].send(reply(1, 1))
    # Worker 3 never sends; q = 3 counts the aggregator's own reply (rank 0).
    result = aggregator.gather(1, q=3, timeout_s=60, own=reply(1, 0), numel=3)
    assert result.replies[0].rank == 0 and sorted(m.rank for m in result.replies) == [0, 1, 2]
    assert 3 not in result.received
    assert all(torch.equal(m.gradient, torch.full((3,), float(m.rank))) for m in result.replies)  # type: ignore[arg-type]


def test_deadline_with_fewer_than_q_replies_raises(channels) -> None:  # type: ignore[no-untyped-def]
    aggregator, workers = channels
    workers[1].send(reply(1, 1))
    workers[2].send(reply(1, 2))
    with pytest.raises(
        GatherTimeoutError, match=r"3 of q=4 gradients.*no reply from ranks \[3\]"
    ) as info:
        aggregator.gather(1, q=4, timeout_s=0.5, own=reply(1, 0), numel=3)
    assert info.value.received == 3 and info.value.q == 4 and info.value.round_index == 1


def test_a_late_reply_of_a_closed_round_is_discarded(channels) -> None:  # type: ignore[no-untyped-def]
    aggregator, workers = channels
    for r in (1, 2):
        workers[r].send(reply(1, r))
    first = aggregator.gather(1, q=3, timeout_s=60, own=reply(1, 0))
    assert 3 not in first.received
    workers[3].send(reply(1, 3))  # too late for round 1
    for r in (1, 2, 3):
        workers[r].send(reply(2, r))
    second = aggregator.gather(2, q=4, timeout_s=60, own=reply(2, 0))
    assert second.stale == 1
    assert sorted(m.rank for m in second.replies) == [0, 1, 2, 3]
    assert all(m.round_index == 2 for m in second.replies)


def test_replies_without_a_gradient_or_of_the_wrong_size_do_not_count(channels) -> None:  # type: ignore[no-untyped-def]
    aggregator, workers = channels
    workers[1].send(reply(1, 1, gradient=False))
    workers[2].send(reply(1, 2, numel=5))
    workers[3].send(reply(1, 3))
    with pytest.raises(GatherTimeoutError, match="2 of q=3"):
        aggregator.gather(1, q=3, timeout_s=0.5, own=reply(1, 0), numel=3)


def test_updates_reach_every_worker_in_order(channels) -> None:  # type: ignore[no-untyped-def]
    aggregator, workers = channels
    assert workers[1].poll_update() is None
    for k in (1, 2):
        aggregator.send_update(
            UpdateMessage(k, (3, 2, 2, 1), 0xABC if k == 2 else None, torch.arange(4.0) * k)
        )
    for worker in workers.values():
        first = worker.recv_update(timeout_s=30)
        assert (
            first.round_index == 1 and first.checksum is None and first.next_sizes == (3, 2, 2, 1)
        )
        deadline = time.monotonic() + 30
        second = worker.poll_update()
        while second is None and time.monotonic() < deadline:
            second = worker.poll_update()
        assert second is not None and second.round_index == 2 and second.checksum == 0xABC
        assert torch.equal(second.gradient, torch.arange(4.0) * 2)
        assert worker.poll_update() is None


def test_an_impersonating_or_garbled_worker_is_disconnected(channels) -> None:  # type: ignore[no-untyped-def]
    aggregator, workers = channels
    workers[1].send(reply(1, 2))  # worker 1 claims to be rank 2
    workers[2]._sock.sendall(b"garbage-that-is-not-a-frame")  # noqa: SLF001 - a Byzantine byte stream
    workers[3].send(reply(1, 3))
    result = aggregator.gather(1, q=2, timeout_s=60, own=reply(1, 0))
    assert sorted(m.rank for m in result.replies) == [0, 3]
    deadline = time.monotonic() + 30
    while len(aggregator.disconnected) < 2 and time.monotonic() < deadline:
        with pytest.raises(GatherTimeoutError):
            aggregator.gather(2, q=3, timeout_s=0.2, own=reply(2, 0))
    assert set(aggregator.disconnected) == {1, 2}
    assert "claimed to be rank 2" in aggregator.disconnected[1]
    assert "magic" in aggregator.disconnected[2]
    assert aggregator.connected == [3]


def test_a_connection_with_a_wrong_token_is_refused() -> None:
    token = os.urandom(32)
    with AggregatorChannel(2, token, io_timeout_s=5) as aggregator:
        intruder = socket.create_connection(aggregator.address)
        intruder.sendall(Hello(1, 2, os.urandom(32)).encode())
        honest = WorkerChannel(aggregator.address, 1, 2, token)
        aggregator.accept(timeout_s=30)
        assert aggregator.connected == [1]
        assert intruder.recv(1) == b""  # the aggregator closed the intruder's connection
        intruder.close()
        honest.close()
    with AggregatorChannel(2, token, io_timeout_s=5) as aggregator:
        with pytest.raises(ChannelError, match=r"workers \[1\] did not connect"):
            aggregator.accept(timeout_s=0.3)


def test_frame_buffer_waits_for_whole_frames_and_refuses_oversized_ones() -> None:
    data = reply(7, 1).encode()
    buffer = FrameBuffer()
    buffer.feed(data[:10])
    assert buffer.pop() is None
    buffer.feed(data[10:])
    kind, body = buffer.pop()  # type: ignore[misc]
    assert GradientMessage.decode(body).round_index == 7
    small = FrameBuffer(max_body_bytes=8)
    small.feed(data)
    with pytest.raises(ChannelError, match="exceeds the limit"):
        small.pop()


def test_a_disconnected_worker_makes_an_unreachable_q_fail_at_once(channels) -> None:  # type: ignore[no-untyped-def]
    aggregator, workers = channels
    workers[3].close()  # crashed
    workers[1].send(reply(1, 1))
    workers[2].send(reply(1, 2))
    with pytest.raises(
        GatherTimeoutError, match=r"3 of q=4.*disconnected: \{3: 'closed the connection'\}"
    ):
        aggregator.gather(1, q=4, timeout_s=3600, own=reply(1, 0))


# --- Dead peers (issue 28, case 11): keepalive, and a worker timeout tied to the gather's ------


def _keepalive_of(sock: socket.socket) -> tuple[int, int, int, int, int]:
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
    )


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux socket options")
def test_every_channel_socket_declares_a_silent_peer_dead_within_the_gather_timeout() -> None:
    config = DistributedConfig(model="models/m", container="c", gather_timeout_s=120.0)
    keepalive = Keepalive.within(config.keepalive_s)
    assert keepalive.detect_s <= config.gather_timeout_s
    assert keepalive.detect_s >= config.gather_timeout_s / 2  # not so eager that a hiccup kills
    expected = (1, keepalive.idle_s, keepalive.interval_s, keepalive.count, 120_000)
    token = os.urandom(32)
    with AggregatorChannel(2, token, io_timeout_s=10, keepalive=keepalive) as aggregator:
        with WorkerChannel(aggregator.address, 1, 2, token, keepalive=keepalive) as worker:
            aggregator.accept(timeout_s=30)
            assert _keepalive_of(worker.connection) == expected
            assert _keepalive_of(aggregator.connection(1)) == expected


def test_keepalive_settings_fit_any_gather_timeout() -> None:
    for seconds in (0.01, 1.0, 2.0, 7.5, 60.0, 120.0, 600.0, 3600.0):
        keepalive = Keepalive.within(seconds)
        assert min(keepalive.idle_s, keepalive.interval_s, keepalive.count) >= 1
        assert keepalive.detect_s <= max(2.0, seconds)


def test_the_worker_timeout_derives_from_the_gather_timeout() -> None:
    config = DistributedConfig(model="models/m", container="c", gather_timeout_s=120.0)
    # Not the rendezvous timeout (600 s by default): a round's wait follows the gather's.
    assert config.update_timeout_s == 120.0 + config.update_margin_s
    assert config.update_timeout_s < config.channel_timeout_s
    assert config.keepalive_s == 120.0
    longer = config.replace(gather_timeout_s=300.0)
    assert longer.update_timeout_s == 300.0 + config.update_margin_s
    with pytest.raises(DistributedConfigError, match="update_margin_s"):
        config.replace(update_margin_s=0)
    assert DistributedConfig.from_json(config.to_json()) == config


def test_a_worker_whose_aggregator_goes_silent_fails_within_its_derived_timeout() -> None:
    """A peer that accepts and never answers (a half-open connection as after a link cut): the
    worker's wait for the update ends with a ChannelError, as its config derives it."""
    config = DistributedConfig(
        model="models/m", container="c", gather_timeout_s=0.05, update_margin_s=0.05
    )
    with socket.create_server(("127.0.0.1", 0)) as silent:
        worker = WorkerChannel(
            silent.getsockname()[:2],
            1,
            2,
            os.urandom(32),
            connect_timeout_s=10,
            keepalive=Keepalive.within(config.keepalive_s),
        )
        accepted, _ = silent.accept()  # and never reads nor writes
        with worker, accepted:
            worker.send(reply(1, 1))
            with pytest.raises(ChannelError, match="got no update from the aggregator"):
                worker.recv_update(config.update_timeout_s)
