"""Checking and picking TCP ports on the stack's host."""

from __future__ import annotations

import socket
from contextlib import ExitStack

__all__ = ["pick_free_ports", "port_in_use"]


def port_in_use(host: str, port: int) -> bool:
    """True if some socket already holds ``host:port`` (listening or merely bound).

    Binding with SO_REUSEADDR, as Swift and memcached do, so connections of an earlier run
    lingering in TIME_WAIT do not count as "in use".
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports the kernel reports free right now (for tests and benchmarks).

    Another program may still take one before it is used; the stack then refuses with
    PortInUseError rather than clashing.
    """
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            # All sockets stay open until every port is chosen, so the ports are distinct.
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
    return ports
