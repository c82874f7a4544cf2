"""glibc's malloc bounded at runtime start (issue 27): freed request memory leaves the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hapi_core import host_allocator

# A fresh process frees a 24 MiB mmap'd block (glibc's dynamic threshold then rises to 24 MiB;
# its cap is 32), then writes and frees a 16 MiB block: by default that block comes from the
# heap and stays resident; bounded, it is mmap'd and unmapped. The grown resident bytes are
# printed.
_PROBE = textwrap.dedent(
    """
    import ctypes, os, sys
    from hapi_core.host_allocator import bound_host_allocator
    if sys.argv[1] == "bounded":
        assert bound_host_allocator()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page
    big = libc.malloc(24 << 20)
    ctypes.memset(big, 1, 24 << 20)
    libc.free(big)
    before = rss()
    block = libc.malloc(16 << 20)
    ctypes.memset(block, 1, 16 << 20)
    libc.free(block)
    print(rss() - before)
    """
)


def _grown(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return int(out.stdout.strip())


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or host_allocator._mallopt() is None,
    reason="glibc on Linux only",
)
def test_a_freed_block_leaves_the_process_once_bounded() -> None:
    # The default keeps the 16 MiB block resident after its free; bounded, (almost) none of it.
    assert _grown("default") >= 12 << 20
    assert _grown("bounded") < 2 << 20


def test_every_setting_is_passed_to_mallopt() -> None:
    calls: list[tuple[int, int]] = []

    def mallopt(param: int, value: int) -> int:
        calls.append((param, value))
        return 1

    assert host_allocator.bound_host_allocator(mallopt)
    assert calls == [
        (-8, host_allocator.ARENA_MAX),
        (-3, host_allocator.MMAP_THRESHOLD_BYTES),
        (-1, host_allocator.TRIM_THRESHOLD_BYTES),
    ]


def test_a_refused_setting_is_reported() -> None:
    assert not host_allocator.bound_host_allocator(lambda param, value: int(param != -8))
