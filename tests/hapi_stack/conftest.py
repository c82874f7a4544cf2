"""Helpers for the stack tests: what /proc says, read independently of hapi_stack's own code."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()  # fields 3 (state), 4 (ppid), ...


def _running(pid: int, start_time: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in "ZX" and int(fields[19]) == start_time


def _live_children() -> set[int]:
    children = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == os.getpid() and fields[0] not in "ZX":
                children.add(int(entry.name))
    return children


@pytest.fixture
def pid_running() -> Callable[[int, int], bool]:
    """``pid_running(pid, start_time)``: that very process exists and is not a zombie."""
    return _running


@pytest.fixture
def live_children() -> Callable[[], set[int]]:
    """``live_children()``: PIDs of this test process's children that are still running."""
    return _live_children
