"""Helpers of the tests that run a job under real torchrun and stop it from outside: wait for
what the job writes (never a sleep standing in for it), read its checkpoint's round, and the
environment its workers need."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hapi_client import SwiftCredentials
from hapi_client.distributed.checkpoint import CHECKPOINT_FILE


def wait_for(what: str, check: Callable[[], Any], proc: subprocess.Popen[bytes]) -> Any:
    """Poll ``check`` until it returns something truthy; fail if torchrun ends first."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"torchrun exited with {proc.returncode} while waiting for {what}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def checkpoint_round(directory: Path) -> int:
    """The global round of the checkpoint in ``directory`` (0: none yet); the JSON is replaced
    atomically, so it is always whole."""
    try:
        return int(json.loads((directory / CHECKPOINT_FILE).read_text())["global_round"])
    except FileNotFoundError:
        return 0


def torchrun_env(credentials: SwiftCredentials, **extra: str) -> dict[str, str]:
    """This process's environment for torchrun: one torch thread per worker, the credentials in
    ``ST_AUTH``/``ST_USER``/``ST_KEY`` (as :func:`~hapi_client.distributed.launch` passes them)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env.update(ST_AUTH=credentials.auth_url, ST_USER=credentials.user, ST_KEY=credentials.key)
    return env
