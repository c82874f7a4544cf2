"""Where rank 0's gradient channel listens, and the host it hands the workers.

torch's rendezvous gives every rank ``MASTER_ADDR`` as a *name* (rank 0's node FQDN, or
torchrun's ``--local-addr``) that each rank resolves for itself. The channel does the same:
rank 0 never resolves a name to advertise its result, because with the usual Debian/Ubuntu
``/etc/hosts`` a host's own name resolves *there* to 127.0.1.1, an address no other node can
reach. :func:`choose_channel_address` decides, from the settings and the environment alone
(resolving a name only to check an explicit bind address), and never hands a loopback address
to workers that may run on another node.

The settings, first given wins: ``DistributedConfig.channel_bind``/``channel_advertise`` (the
CLI's ``--channel-bind``/``--channel-advertise``), then this node's ``HAPI_CHANNEL_BIND``/
``HAPI_CHANNEL_ADVERTISE`` (read on rank 0, whichever node that is), then the defaults:

- every rank on this node (``LOCAL_WORLD_SIZE == WORLD_SIZE``; without these, a loopback
  ``MASTER_ADDR``): bind and advertise 127.0.0.1, nothing listens on the network;
- several nodes: bind all interfaces (as torch's TCPStore does; the channel's token
  authenticates every connection) and advertise ``MASTER_ADDR``, the name torch's own ranks
  reached rank 0 by, else this host's name, else its first non-loopback address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .errors import ChannelError

__all__ = [
    "ADVERTISE_ENV",
    "BIND_ENV",
    "ChannelAddress",
    "choose_channel_address",
    "is_literal",
    "is_loopback_host",
    "is_wildcard",
    "resolve_host",
]

BIND_ENV = "HAPI_CHANNEL_BIND"
ADVERTISE_ENV = "HAPI_CHANNEL_ADVERTISE"

#: Names that are loopback on every host by definition (RFC 6761), whatever a resolver says.
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_WILDCARDS = frozenset({"0.0.0.0", "::"})  # noqa: S104 (all interfaces, on purpose)

#: ``host -> addresses`` (socket.getaddrinfo's answers; empty when the name does not resolve).
Resolver = Callable[[str], list[str]]


def resolve_host(host: str) -> list[str]:
    """The addresses ``host`` resolves to on this machine (empty if it does not)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def is_literal(host: str) -> bool:
    """True for an IP address (not a name)."""
    return _literal(host) is not None


def is_loopback_host(host: str) -> bool:
    """True for a loopback address or a name that is loopback everywhere (``localhost``).

    Any other name is not: where it resolves is each host's business (``node0`` may be
    127.0.1.1 on node0 itself and 10.0.0.1 everywhere else).
    """
    name = host.strip().lower().rstrip(".")
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    address = _literal(name)
    return address is not None and address.is_loopback


def is_wildcard(host: str) -> bool:
    """True for a bind address meaning all interfaces (``0.0.0.0``, ``::``)."""
    return host.strip().strip("[]") in _WILDCARDS


@dataclass(frozen=True)
class ChannelAddress:
    """Where rank 0 binds (``""``: all interfaces) and the host the workers connect to."""

    bind: str
    advertise: str
    why: str
    """Where ``advertise`` came from, for the log and for errors."""


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def choose_channel_address(
    bind: str | None,
    advertise: str | None,
    environ: Mapping[str, str],
    *,
    hostname: str | None = None,
    resolve: Resolver = resolve_host,
) -> ChannelAddress:
    """Decide rank 0's bind address and advertised host (see the module's docstring).

    ``bind``/``advertise`` are the config's settings (None: not set); ``environ`` holds torchrun's
    ``MASTER_ADDR``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and this node's ``HAPI_CHANNEL_*``.
    Raises :class:`ChannelError` for settings no worker on another node could connect with.
    """
    bind = bind or _env(environ, BIND_ENV)
    advertise = advertise or _env(environ, ADVERTISE_ENV)
    master = _env(environ, "MASTER_ADDR")
    world, local = _int(environ, "WORLD_SIZE"), _int(environ, "LOCAL_WORLD_SIZE")
    if world is not None and local is not None:
        one_host = local >= world  # torchrun says where the ranks are
    else:  # no torchrun: the ranks all reached torch's store over loopback, or may be anywhere
        one_host = master is not None and is_loopback_host(master)
    hostname = hostname if hostname is not None else socket.gethostname()

    if bind is not None and is_wildcard(bind):
        bind_host = ""
    elif bind is not None:
        bind_host = bind
        found = resolve(bind)
        if not one_host and (
            is_loopback_host(bind) or (found and all(map(is_loopback_host, found)))
        ):
            raise ChannelError(
                f"the gradient channel's bind address {bind!r} is loopback here "
                f"({', '.join(found) or bind}): workers on other nodes cannot reach it. Leave "
                f"channel_bind unset (all interfaces) or name a non-loopback address"
            )
    else:
        bind_host = "127.0.0.1" if one_host and advertise is None else ""

    if advertise is not None:
        if not one_host and is_loopback_host(advertise):
            raise ChannelError(
                f"channel_advertise {advertise!r} is a loopback address: workers on other nodes "
                "would connect to themselves. Give a name or address of rank 0's node they reach"
            )
        return ChannelAddress(bind_host, advertise, "channel_advertise")
    if bind_host:
        return ChannelAddress(bind_host, bind_host, "the bind address")
    if one_host:
        return ChannelAddress(bind_host, "127.0.0.1", "every rank runs on this host")
    for name, source in ((master, "MASTER_ADDR"), (hostname, "this host's name")):
        if name and not is_loopback_host(name):
            # A name, not what it resolves to here: each worker resolves it for itself.
            return ChannelAddress(bind_host, name, source)
    for address in resolve(hostname):
        if not is_loopback_host(address):
            return ChannelAddress(bind_host, address, f"an address of {hostname!r}")
    raise ChannelError(
        f"no host to advertise the gradient channel at: MASTER_ADDR is {master!r}, this host's "
        f"name {hostname!r} is loopback and resolves to no other address. Set channel_advertise "
        f"(--channel-advertise, or {ADVERTISE_ENV} on the nodes) to a name or address of this "
        "node that the other nodes reach"
    )
