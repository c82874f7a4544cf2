"""``hapi stack ...`` through hapi_cli.main.main, in this process."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

import hapi_cli.main as cli
from hapi_stack import PORT_SETTINGS, StackConfig, StackError, running_stack


def _port_flags(config: StackConfig) -> list[str]:
    flags = []
    for setting in PORT_SETTINGS:
        flags += ["--" + setting.replace("_", "-"), str(getattr(config, setting))]
    return flags


@pytest.mark.swift
@pytest.mark.slow
def test_up_status_down_round_trip(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    pid_running: Callable[[int, int], bool],
) -> None:
    config = StackConfig.on_free_ports()
    state = ["--state-dir", str(tmp_path)]
    try:
        assert cli.main(["stack", "up", "--no-hapi-server", *state, *_port_flags(config)]) == 0
        out = capsys.readouterr().out
        assert "Started the stack in" in out
        assert f"http://127.0.0.1:{config.proxy_port}/auth/v1.0" in out
        assert "test:tester / testing" in out and "test2:tester2 / testing2" in out

        assert cli.main(["stack", "status", *state]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split() == ["SERVICE", "PID", "PORT", "ALIVE", "HEALTHY"]
        proxy_row = next(line.split() for line in table if line.startswith("proxy"))
        assert proxy_row[2:] == [str(config.proxy_port), "yes", "yes"]

        assert cli.main(["stack", "up", "--no-hapi-server", *state, *_port_flags(config)]) == 0
        assert "Already running" in capsys.readouterr().out

        recorded = json.loads((tmp_path / "pids.json").read_text())["services"]
        assert len(recorded) == 5
    finally:
        assert cli.main(["stack", "down", *state]) == 0
    assert "Stopped proxy, object, container, account, memcached" in capsys.readouterr().out
    assert not any(pid_running(s["pid"], s["start_time"]) for s in recorded)
    assert not (tmp_path / "pids.json").exists()

    assert cli.main(["stack", "down", *state]) == 0
    assert "Nothing was running" in capsys.readouterr().out
    assert cli.main(["stack", "status", *state]) == 1
    assert "No stack recorded" in capsys.readouterr().out


def _recorded(state_dir: Path) -> dict[str, tuple[int, int]]:
    services = json.loads((state_dir / "pids.json").read_text())["services"]
    return {s["name"]: (s["pid"], s["start_time"]) for s in services}


def _kill(state_dir: Path, name: str) -> None:
    """SIGKILL a recorded service and reap it: the stack's processes are this test's children."""
    pid, _ = _recorded(state_dir)[name]
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.mark.swift
@pytest.mark.slow
def test_up_on_a_partly_stopped_stack_starts_only_what_is_down(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    pid_running: Callable[[int, int], bool],
) -> None:
    config = StackConfig.on_free_ports()
    state = ["--state-dir", str(tmp_path)]
    up = ["stack", "up", "--no-hapi-server", *state, *_port_flags(config)]
    try:
        assert cli.main(up) == 0
        capsys.readouterr()
        before = _recorded(tmp_path)
        conn = running_stack(StackConfig(state_dir=tmp_path)).connection(retries=0)
        conn.put_container("kept")
        conn.put_object("kept", "a", b"survives restarts")

        _kill(tmp_path, "memcached")
        _kill(tmp_path, "object")
        assert cli.main(up) == 0
        out = capsys.readouterr().out
        assert "Restarted memcached, object in" in out and "the other services kept running" in out
        after = _recorded(tmp_path)
        assert list(after) == list(before)  # start order kept
        for name in ("account", "container", "proxy"):
            assert after[name] == before[name], name  # not restarted
        for name in ("memcached", "object"):
            assert after[name] != before[name] and pid_running(*after[name]), name
            assert not pid_running(*before[name]), name
        # The proxy uses the new memcached: the old token is gone, a new login works.
        fresh = running_stack(StackConfig(state_dir=tmp_path)).connection(retries=0)
        assert fresh.get_object("kept", "a")[1] == b"survives restarts"

        # Partly down with other settings: refused, nothing started, the record unchanged.
        _kill(tmp_path, "proxy")
        assert cli.main(["stack", "up", "--hapi-server", *state, *_port_flags(config)]) == 2
        assert "other settings" in capsys.readouterr().err
        assert _recorded(tmp_path) == after
        assert cli.main(["stack", "status", *state]) == 1
        # The dead proxy's port taken by another program: refused before starting anything.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
            # SO_REUSEADDR: the killed proxy's connections may linger in TIME_WAIT.
            blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            blocker.bind(("127.0.0.1", config.proxy_port))
            blocker.listen()
            assert cli.main(up) == 2
            assert f"port {config.proxy_port}" in capsys.readouterr().err
        assert _recorded(tmp_path) == after
        assert cli.main(up) == 0
        assert "Restarted proxy in" in capsys.readouterr().out
        final = _recorded(tmp_path)
        assert final["proxy"] != after["proxy"]
        assert {n: final[n] for n in final if n != "proxy"} == {
            n: after[n] for n in after if n != "proxy"
        }
    finally:
        assert cli.main(["stack", "down", *state]) == 0
    assert "Stopped proxy, object, container, account, memcached" in capsys.readouterr().out
    assert not any(pid_running(*p) for p in final.values())


def test_library_errors_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["stack", "up", "--state-dir", str(tmp_path), "--proxy-port", "7001"]
    assert cli.main([*args, "--object-port", "7001"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hapi: error: invalid stack settings:")
    assert "proxy_port and object_port are both 7001" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(StackError):
        cli.main(["--debug", *args, "--object-port", "7001"])


def test_usage_errors_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stack", "up", "--proxy-port", "not-a-number"]) == 2
    assert "invalid int value" in capsys.readouterr().err
    assert cli.main(["stack"]) == 2
    assert cli.main(["--help"]) == 0
    assert "stack" in capsys.readouterr().out


def test_command_modules_not_written_yet_are_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["hapi_cli.stack_cmd", "hapi_cli.no_such_cmd"])
    assert cli.main(["stack", "down", "--help"]) == 0
    assert "--state-dir" in capsys.readouterr().out
