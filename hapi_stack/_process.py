"""Starting and stopping processes by PID, guarded by their start time.

A PID alone can be recycled by the kernel once a process exits; the start time in
``/proc/PID/stat`` (field 22, clock ticks since boot) identifies the process for good. Nothing
here ever looks processes up by name.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ProcessId",
    "is_alive",
    "process_state",
    "spawn",
    "start_time",
    "stop_processes",
    "tail",
]

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class ProcessId:
    """A process identified by PID and start time (clock ticks since boot)."""

    pid: int
    start_time: int


def _stat_fields(pid: int) -> list[str] | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is parenthesised and may hold spaces or ')': cut at the last ')'.
    return data[data.rindex(")") + 2 :].split()  # fields 3, 4, ...


def process_state(pid: int) -> tuple[str, int] | None:
    """``(state letter, start time)`` of ``pid`` from /proc, or None if there is no such PID."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return fields[0], int(fields[19])  # fields 3 and 22


def start_time(pid: int) -> int:
    """The start time of a running ``pid``; ProcessLookupError if it does not exist."""
    state = process_state(pid)
    if state is None:
        raise ProcessLookupError(pid)
    return state[1]


def _reap(pid: int) -> None:
    # Our own children stay zombies (and keep their /proc entry) until waited for.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent (or init) reaps it


def is_alive(proc: ProcessId) -> bool:
    """True if ``proc`` is still running: same PID and start time, and not a zombie."""
    _reap(proc.pid)
    state = process_state(proc.pid)
    return state is not None and state[1] == proc.start_time and state[0] not in ("Z", "X")


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> ProcessId:
    """Start ``argv`` in its own session, stdout and stderr appended to ``log_path``.

    Its own session, so that Ctrl-C in the terminal that ran ``hapi stack up`` does not reach it.
    posix_spawn rather than subprocess.Popen: these processes outlive any Popen object, which
    would warn when collected while its process still runs.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    pid = os.posix_spawn(
        argv[0],
        list(argv),
        dict(env),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log_path), flags, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )
    proc = ProcessId(pid, start_time(pid))
    logger.debug("started pid %d: %s", pid, " ".join(argv))
    return proc


def _signal(proc: ProcessId, signum: signal.Signals) -> None:
    if is_alive(proc):  # checked right before: never signal a recycled PID
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            pass


def _wait_gone(procs: Sequence[ProcessId], timeout: float) -> list[ProcessId]:
    deadline = time.monotonic() + timeout
    remaining = [p for p in procs if is_alive(p)]
    while remaining and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        remaining = [p for p in remaining if is_alive(p)]
    return remaining


def stop_processes(procs: Sequence[ProcessId], timeout: float) -> list[ProcessId]:
    """SIGTERM the live ones of ``procs``, SIGKILL what is left after ``timeout`` seconds.

    Returns the processes that were still running and got signalled. Processes whose PID now
    belongs to another process (different start time) are left alone. Raises OSError if a
    process survives SIGKILL.
    """
    targets = [p for p in procs if is_alive(p)]
    for proc in targets:
        _signal(proc, signal.SIGTERM)
    stubborn = _wait_gone(targets, timeout)
    for proc in stubborn:
        logger.warning("pid %d ignored SIGTERM for %.1f s; sending SIGKILL", proc.pid, timeout)
        _signal(proc, signal.SIGKILL)
    survivors = _wait_gone(stubborn, _KILL_GRACE_S)
    if survivors:
        pids = ", ".join(str(p.pid) for p in survivors)
        raise OSError(f"processes {pids} are still running after SIGKILL")
    return targets


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
