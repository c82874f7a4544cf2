"""The stack's torch processes share the host's cores: their OpenMP threads wait passively."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hapi_stack import SHARED_HOST_THREADS, StackConfig, shared_host_env, stack_services


def test_the_shared_host_settings_keep_what_the_user_set() -> None:
    assert shared_host_env({}) == dict(SHARED_HOST_THREADS)
    assert shared_host_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {}


def test_the_proxy_and_the_hapi_server_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    specs = {
        spec.name: spec
        for spec in stack_services(StackConfig(state_dir=tmp_path, hapi_server=True))
    }
    for name in ("proxy", "hapi-server"):
        assert specs[name].env["OMP_WAIT_POLICY"] == "PASSIVE", name
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice is inherited, not replaced
    specs = {
        spec.name: spec
        for spec in stack_services(StackConfig(state_dir=tmp_path, hapi_server=True))
    }
    assert "OMP_WAIT_POLICY" not in specs["hapi-server"].env


def test_the_hapi_command_sets_them_before_its_handlers_import_torch() -> None:
    code = (
        "import os, sys\n"
        "from hapi_cli.main import main\n"
        "main(['stack', 'status', '--state-dir', sys.argv[1]])\n"
        "print(os.environ.get('OMP_WAIT_POLICY'))\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code, "/nonexistent-hapi-state"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE", out.stderr
