"""Opening the gradient side channel: rank 0 listens and broadcasts its address and a token.

The aggregator (rank 0) binds a socket, draws a fresh secret token and broadcasts
``host:port`` and the token over torch.distributed; every other rank connects with them, and
rank 0 waits until all have.
"""

from __future__ import annotations

import os
import secrets

import torch
import torch.distributed as dist

from .channel import AggregatorChannel, WorkerChannel
from .config import DistributedConfig
from .messages import TOKEN_BYTES

__all__ = ["open_channels"]

#: Room for ``host:port`` in the broadcast buffer.
_ADDRESS_BYTES = 256


def open_channels(
    config: DistributedConfig, rank: int, world: int
) -> tuple[AggregatorChannel | None, WorkerChannel | None]:
    """``(aggregator, None)`` on rank 0, ``(None, worker channel)`` on the others."""
    buf = torch.zeros(_ADDRESS_BYTES + TOKEN_BYTES, dtype=torch.uint8)
    aggregator: AggregatorChannel | None = None
    if rank == 0:
        host = config.channel_host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        token = secrets.token_bytes(TOKEN_BYTES)
        aggregator = AggregatorChannel(
            world, token, host=host, io_timeout_s=config.channel_timeout_s
        )
        bound_host, port = aggregator.address
        address = f"{bound_host}:{port}".encode()
        buf[: len(address)] = torch.frombuffer(bytearray(address), dtype=torch.uint8)
        buf[_ADDRESS_BYTES:] = torch.frombuffer(bytearray(token), dtype=torch.uint8)
    dist.broadcast(buf, src=0)
    if aggregator is not None:
        try:
            aggregator.accept(config.channel_timeout_s)
        except BaseException:
            aggregator.close()
            raise
        return aggregator, None
    raw = bytes(buf[:_ADDRESS_BYTES].tolist()).rstrip(b"\0").decode()
    host, _, port_text = raw.rpartition(":")
    token = bytes(buf[_ADDRESS_BYTES:].tolist())
    channel = WorkerChannel(
        (host, int(port_text)),
        rank,
        world,
        token,
        connect_timeout_s=config.channel_timeout_s,
        io_timeout_s=config.channel_timeout_s,
    )
    return None, channel
