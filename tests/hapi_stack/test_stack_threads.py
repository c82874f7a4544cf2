"""The stack's torch processes share the host's cores: their OpenMP threads wait passively, and
their malloc maps its blocks on transparent huge pages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hapi_stack import (
    HOST_ALLOCATOR,
    SHARED_HOST_ENV,
    StackConfig,
    shared_host_env,
    stack_services,
)


def test_the_shared_host_settings_keep_what_the_user_set() -> None:
    assert shared_host_env({}) == dict(SHARED_HOST_ENV)
    assert "OMP_WAIT_POLICY" not in shared_host_env({"OMP_WAIT_POLICY": "ACTIVE"})
    assert "GLIBC_TUNABLES" not in shared_host_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"})


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


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "never"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else "never"


@pytest.mark.skipif(
    _thp_mode() != "madvise", reason="huge pages only where asked for (madvise) show the request"
)
def test_a_process_with_the_allocator_setting_asks_for_huge_pages_on_large_blocks() -> None:
    """A 64 MiB block (mmap'd, as every block from 1 MiB is on a host): with the setting its
    mapping is marked for transparent huge pages (``hg`` in its ``VmFlags``), without it not.
    How many huge pages the kernel then gives depends on its free memory, not on us."""
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "p = libc.malloc(64 << 20)\n"
        "ctypes.memset(p, 1, 64 << 20)\n"
        "inside = False\n"
        "for line in open('/proc/self/smaps'):\n"
        "    head = line.split()[0]\n"
        "    if '-' in head and ':' not in head:\n"
        "        lo, hi = (int(v, 16) for v in head.split('-'))\n"
        "        inside = lo <= p < hi\n"
        "    elif inside and line.startswith('VmFlags:'):\n"
        "        print(line.split(':', 1)[1].strip())\n"
    )

    def flags(env: dict[str, str]) -> list[str]:
        out = subprocess.run(  # noqa: S603
            [sys.executable, "-c", code],
            env={"PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout.split()

    assert "hg" in flags(dict(HOST_ALLOCATOR))
    assert "hg" not in flags({})
