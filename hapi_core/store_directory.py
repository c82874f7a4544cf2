"""One feature-store directory for several processes: each owns a subdirectory while it runs.

Processes may name the same ``HAPI_FEATURE_STORE_DIR`` (the filter's ``feature_store_dir``):
the proxy's workers, or a server restarted while a sibling still runs. Each keeps its entries
in a subdirectory of its own, which only it writes, evicts and counts (the byte bound is per
process). A process that is killed leaves its subdirectory behind, with its entries and the
``.part`` file of a write it did not finish; the next store to start removes it.

Whether a subdirectory's process has ended is asked of the kernel rather than of ``/proc``: its
owner holds an exclusive ``flock(2)`` on the subdirectory's lock file as long as it lives, and
the kernel drops that lock when the process ends, however it ends. A lock another store can take
is an owner gone; one it cannot take is a live process's, whose files are never touched. Unlike
a PID and its start time, this needs no guard against recycled PIDs and holds across PID
namespaces (containers sharing a volume); and ``hapi_stack``'s ``/proc`` reader is not
importable from the core (docs/architecture.md). ``flock`` locks of two open files conflict even
within one process, so two stores of one process are siblings like any others. Over NFS, Linux
emulates ``flock`` with POSIX locks, which do not conflict within a process: there, one store
per process.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOCK_NAME", "OwnedDirectory", "claim", "remove_ended"]

log = logging.getLogger(__name__)

LOCK_NAME = "owner.lock"
"""The file in each subdirectory whose ``flock`` its owning process holds."""

_STAGING = "."


@dataclass(frozen=True)
class OwnedDirectory:
    """A subdirectory of the store's directory that this process holds while it runs."""

    path: Path
    lock_fd: int
    """The open lock file; closing it hands the subdirectory to the next store that starts."""


def claim(root: Path) -> OwnedDirectory:
    """A new subdirectory of ``root`` (created if missing), owned until this process ends.
    OSError when ``root`` cannot be written."""
    root.mkdir(parents=True, exist_ok=True)
    # Made and locked under a hidden name, then renamed: a store sweeping meanwhile skips hidden
    # names, so it never finds this subdirectory unlocked. The PID in the name is for people.
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f"{_STAGING}{os.getpid()}-"))
    fd = -1
    try:
        fd = os.open(staging / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = root / staging.name.removeprefix(_STAGING)
        os.rename(staging, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return OwnedDirectory(path, fd)


def remove_ended(root: Path) -> list[Path]:
    """Remove the subdirectories of ``root`` whose owning process has ended; the removed ones.
    Running processes' subdirectories, hidden names and anything without a lock file are left
    alone. OSError when ``root`` cannot be listed."""
    removed = []
    for sub in sorted(root.iterdir()):
        if sub.name.startswith(_STAGING) or not sub.is_dir():
            continue
        try:
            fd = os.open(sub / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # not a store's subdirectory, or another store is removing it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its process runs
        try:
            _remove(sub)
            removed.append(sub)
        except FileNotFoundError:
            pass  # another store starting took the lock after us, once we had removed it
        except OSError as exc:
            log.warning("could not remove the ended feature store %s (%s)", sub, exc)
        finally:
            os.close(fd)
    return removed


def _remove(sub: Path) -> None:
    # The lock file goes last: a subdirectory half removed keeps it, and a later start retries.
    for path in sub.iterdir():
        if path.name != LOCK_NAME:
            path.unlink(missing_ok=True)
    (sub / LOCK_NAME).unlink(missing_ok=True)
    sub.rmdir()
