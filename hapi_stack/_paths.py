"""The layout of a stack's state directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["StatePaths"]


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
