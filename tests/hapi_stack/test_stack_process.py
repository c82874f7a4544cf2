"""The PID bookkeeping, on throw-away processes (no Swift needed)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hapi_stack._process import ProcessId, is_alive, spawn, start_time, stop_processes, tail

_IGNORE_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def _wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.02)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[ProcessId]]:
    """Processes a test spawns; whatever is left is killed at the end."""
    procs: list[ProcessId] = []
    yield procs
    stop_processes(procs, timeout=0.1)


def test_start_time_matches_proc(tmp_path: Path) -> None:
    fields = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    assert start_time(os.getpid()) == int(fields[19])
    with pytest.raises(ProcessLookupError):
        start_time(2**22 + 1)  # above the kernel's pid_max


def test_spawn_logs_and_stop_reaps(
    tmp_path: Path, started: list[ProcessId], pid_running: Callable[[int, int], bool]
) -> None:
    log = tmp_path / "logs" / "p.log"
    code = "import sys, time; print('out', flush=True); print('err', file=sys.stderr, flush=True)"
    proc = spawn([sys.executable, "-c", code + "; time.sleep(60)"], os.environ, log)
    started.append(proc)
    assert is_alive(proc)
    _wait_for(lambda: "err" in tail(log))
    assert tail(log).splitlines() == ["out", "err"]
    assert stop_processes([proc], timeout=10) == [proc]
    assert not is_alive(proc)
    assert not pid_running(proc.pid, proc.start_time)
    assert not Path(f"/proc/{proc.pid}").exists()  # reaped, not left a zombie


def test_a_recycled_pid_is_never_signalled(
    tmp_path: Path, started: list[ProcessId], pid_running: Callable[[int, int], bool]
) -> None:
    proc = spawn([sys.executable, "-c", "import time; time.sleep(60)"], os.environ, tmp_path / "l")
    started.append(proc)
    impostor = ProcessId(proc.pid, proc.start_time + 1)  # same PID, another process
    assert not is_alive(impostor)
    assert stop_processes([impostor], timeout=0.1) == []
    assert pid_running(proc.pid, proc.start_time)


def test_sigkill_after_the_deadline(
    tmp_path: Path, started: list[ProcessId], pid_running: Callable[[int, int], bool]
) -> None:
    log = tmp_path / "stubborn.log"
    proc = spawn([sys.executable, "-c", _IGNORE_TERM], os.environ, log)
    started.append(proc)
    _wait_for(lambda: "ready" in tail(log))
    assert stop_processes([proc], timeout=0.2) == [proc]
    assert not pid_running(proc.pid, proc.start_time)


def test_a_process_that_already_exited_is_skipped(tmp_path: Path) -> None:
    proc = spawn([sys.executable, "-c", "pass"], os.environ, tmp_path / "quick.log")
    _wait_for(lambda: not is_alive(proc))
    assert stop_processes([proc], timeout=0.1) == []


def test_tail_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert tail(tmp_path / "nope.log") == ""
    (tmp_path / "many.log").write_text("".join(f"{i}\n" for i in range(100)))
    assert tail(tmp_path / "many.log", 3) == "97\n98\n99"
