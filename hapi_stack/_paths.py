"""The layout of a stack's state directory."""

from __future__ import annotations

import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["StatePaths", "find_script", "script_dirs"]


def script_dirs() -> tuple[Path, ...]:
    """Where pip puts the scripts of packages installed for this interpreter, in lookup order.

    Next to the interpreter first (a venv, or the python image's ``/usr/local/bin``); then the
    scripts directory of the default install scheme, because Debian's ``/usr/bin/python3`` has
    pip write ``/usr/local/bin``; then the user scheme's (``pip install --user``).
    """
    candidates = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    user_scheme = sysconfig.get_preferred_scheme("user")
    candidates.append(Path(sysconfig.get_path("scripts", user_scheme)))
    return tuple(dict.fromkeys(candidates))


def find_script(name: str) -> Path | None:
    """The first file called ``name`` in :func:`script_dirs`, or None."""
    for directory in script_dirs():
        path = directory / name
        if path.is_file():
            return path
    return None


@dataclass(frozen=True)
class StatePaths:
    """Absolute paths of everything a stack keeps under its state directory."""

    root: Path

    @classmethod
    def of(cls, state_dir: Path) -> StatePaths:
        # Absolute, because the servers run with another working directory.
        return cls(state_dir.expanduser().resolve())

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def devices(self) -> Path:
        return self.root / "srv"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids_file(self) -> Path:
        return self.root / "pids.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    def conf(self, server: str) -> Path:
        return self.etc / f"{server}-server.conf"

    def log(self, service: str) -> Path:
        return self.logs / f"{service}.log"
