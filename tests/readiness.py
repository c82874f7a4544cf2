"""Waiting for a process the tests started to answer its health URL (shared by the suites)."""

from __future__ import annotations

import subprocess
import time
from typing import Protocol, TypeVar

import httpx


class Started(Protocol):
    """A process the tests started: where it listens, its log, how to stop it."""

    url: str

    def log_tail(self) -> str: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=Started)


def ready(
    started: S,
    proc: subprocess.Popen[bytes],
    path: str,
    *,
    timeout: float,
    status: int = 200,
    poll_s: float = 0.2,
) -> S:
    """``started`` once ``GET url + path`` answers ``status``. If ``proc`` exits or ``timeout``
    seconds pass first, it is stopped and RuntimeError says why, with the end of its log."""
    name = f"{type(started).__name__} at {started.url}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            started.stop()
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{started.log_tail()}")
        try:
            if httpx.get(f"{started.url}{path}", timeout=2).status_code == status:
                return started
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)  # polling a condition with a deadline, not standing in for one
    started.stop()
    raise RuntimeError(f"{name} did not become healthy:\n{started.log_tail()}")
