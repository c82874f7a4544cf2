"""up refusing, failing and cleaning up; each test starts at most one short-lived extra stack."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from hapi_stack import PortInUseError, StackConfig, StackStartError, status, up

# These need Swift and memcached installed, like the session stack, and start their own.
pytestmark = [pytest.mark.swift, pytest.mark.slow]


def test_a_taken_port_is_refused_before_starting_anything(
    tmp_path: Path, live_children: Callable[[], set[int]]
) -> None:
    before = live_children()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", 0))
        taken = blocker.getsockname()[1]
        config = StackConfig.on_free_ports(state_dir=tmp_path, container_port=taken)
        with pytest.raises(PortInUseError, match=f"port {taken}.*--container-port") as refused:
            up(config)
    assert (refused.value.port, refused.value.setting) == (taken, "container_port")
    assert live_children() <= before
    assert not (tmp_path / "pids.json").exists()
    assert not (tmp_path / "logs").exists()
    assert not status(config).recorded


def test_a_failed_start_stops_what_it_started(
    tmp_path: Path, live_children: Callable[[], set[int]]
) -> None:
    before = live_children()
    # A pipeline filter without a section: the proxy exits at once, the others start fine.
    config = StackConfig.on_free_ports(state_dir=tmp_path, proxy_extra_pipeline=["missing"])
    with pytest.raises(StackStartError, match="No section 'missing'") as failed:
        up(config)
    assert failed.value.service.startswith("proxy")
    assert "exited while starting" in str(failed.value)
    assert live_children() <= before
    assert not (tmp_path / "pids.json").exists()
    assert (tmp_path / "logs" / "proxy.log").exists()  # kept for the post-mortem
