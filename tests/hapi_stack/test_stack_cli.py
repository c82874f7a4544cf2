"""``hapi stack ...`` through hapi_cli.main.main, in this process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import hapi_cli.main as cli
from hapi_stack import PORT_SETTINGS, StackConfig, StackError


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
