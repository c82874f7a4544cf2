from __future__ import annotations

import socket

from hapi_stack import pick_free_ports, port_in_use


def test_a_bound_socket_counts_as_in_use_until_closed() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    assert port_in_use("127.0.0.1", port)
    sock.close()
    assert not port_in_use("127.0.0.1", port)


def test_a_listening_socket_counts_as_in_use() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert port_in_use("127.0.0.1", server.getsockname()[1])


def test_pick_free_ports_gives_distinct_free_ports() -> None:
    ports = pick_free_ports(8)
    assert len(set(ports)) == 8
    assert not any(port_in_use("127.0.0.1", p) for p in ports)
