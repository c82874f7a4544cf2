"""Locks between OS threads, also inside an eventlet-patched process (the Swift proxy).

Swift's proxy monkey-patches ``threading`` (eventlet, ``thread=True``): a ``threading.Lock()``
made there is a green lock, and two of eventlet's pool threads contending for one fail with
"Cannot switch to a different thread" (seen here with four ``tpool.execute`` jobs). The in-proxy
execution computes in that pool, and the core's locks (layer times, the memory estimator, the
host-memory probe) are taken from it. They guard a few updates held for microseconds, so a real
OS lock is right in both hosts, and the hub never waits on one for long. eventlet is no
dependency of the core: it is consulted only when the process has imported it already.
"""

from __future__ import annotations

import _thread
import sys
import threading

__all__ = ["os_lock"]


def os_lock() -> _thread.LockType:
    """A new lock between OS threads (``threading.Lock``'s, even under eventlet's patching)."""
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        lock: _thread.LockType = patcher.original("threading").Lock()
        return lock
    return threading.Lock()
