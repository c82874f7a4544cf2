"""``pids.json``: what a stack started, so that ``down`` stops exactly that."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hapi_stack._config import StackConfig
from hapi_stack._process import ProcessId

__all__ = ["ServiceProcess", "StackRecord", "read_record", "remove_record", "write_record"]

logger = logging.getLogger(__name__)


class ServiceProcess(BaseModel):
    """One started service: its process identity, port, health URL and log file."""

    model_config = ConfigDict(frozen=True)

    name: str
    pid: int
    start_time: int
    port: int
    health_url: str | None
    log_path: Path

    @property
    def process(self) -> ProcessId:
        return ProcessId(self.pid, self.start_time)


class StackRecord(BaseModel):
    """The content of ``pids.json``."""

    config: StackConfig
    services: list[ServiceProcess] = Field(default_factory=list)
    created: float = Field(default_factory=time.time)


def read_record(path: Path) -> StackRecord | None:
    """The record at ``path``; None if absent. A corrupt file is logged and treated as absent."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return StackRecord.model_validate_json(text)
    except ValidationError as exc:
        logger.warning("ignoring unreadable %s: %s", path, exc)
        return None


def write_record(path: Path, record: StackRecord) -> None:
    """Replace ``path`` atomically, so a reader never sees half a record."""
    partial = path.with_suffix(".json.tmp")
    partial.write_text(record.model_dump_json(indent=2))
    os.replace(partial, path)


def remove_record(path: Path) -> None:
    path.unlink(missing_ok=True)
