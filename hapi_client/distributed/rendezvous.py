"""Opening the gradient side channel: rank 0 listens and broadcasts its address and a token.

The aggregator (rank 0) binds a socket where :func:`~.addresses.choose_channel_address` says,
draws a fresh secret token and broadcasts ``host:port`` and the token over torch.distributed,
where ``host`` is the advertised host (a name each worker resolves for itself, as torch's
``MASTER_ADDR``); every other rank connects with them, and rank 0 waits until all have.
"""

from __future__ import annotations

import logging
import os
import secrets

import torch
import torch.distributed as dist

from .addresses import ChannelAddress, choose_channel_address
from .channel import AggregatorChannel, Keepalive, WorkerChannel
from .config import DistributedConfig
from .messages import TOKEN_BYTES

__all__ = ["channel_address", "open_channels"]

log = logging.getLogger(__name__)

#: Room for ``host:port`` in the broadcast buffer.
_ADDRESS_BYTES = 256


def channel_address(config: DistributedConfig) -> ChannelAddress:
    """Where rank 0's channel binds and what it advertises (:class:`~.errors.ChannelError` for
    settings no worker on another node could use). Rank 0 asks before it prepares the model, so
    that a bad setting fails at once rather than after every rank's set-up."""
    return choose_channel_address(config.channel_bind, config.channel_advertise, os.environ)


def open_channels(
    config: DistributedConfig, rank: int, world: int, where: ChannelAddress | None = None
) -> tuple[AggregatorChannel | None, WorkerChannel | None]:
    """``(aggregator, None)`` on rank 0 (listening at ``where``, else at
    :func:`channel_address`'s), ``(None, worker channel)`` on the others."""
    buf = torch.zeros(_ADDRESS_BYTES + TOKEN_BYTES, dtype=torch.uint8)
    aggregator: AggregatorChannel | None = None
    if rank == 0:
        where = where or channel_address(config)
        token = secrets.token_bytes(TOKEN_BYTES)
        aggregator = AggregatorChannel(
            world,
            token,
            host=where.bind,
            io_timeout_s=config.channel_timeout_s,
            keepalive=Keepalive.within(config.keepalive_s),
        )
        port = aggregator.address[1]
        log.info(
            "gradient channel: listening on %s:%d, workers connect to %s:%d (%s)",
            where.bind or "*",
            port,
            where.advertise,
            port,
            where.why,
        )
        address = f"{where.advertise}:{port}".encode()
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
    host = host.strip("[]")  # an IPv6 address given in brackets
    token = bytes(buf[_ADDRESS_BYTES:].tolist())
    channel = WorkerChannel(
        (host, int(port_text)),
        rank,
        world,
        token,
        connect_timeout_s=config.channel_timeout_s,
        io_timeout_s=config.channel_timeout_s,
        keepalive=Keepalive.within(config.keepalive_s),
    )
    return None, channel
