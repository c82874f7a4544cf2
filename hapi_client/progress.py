"""Saying what a run is doing: status lines before the first batch, and progress per epoch.

**Status lines** go to the logger ``hapi_client.status`` at INFO level, one per step before the
first batch (preflight, the model, the measured costs, the bandwidth probe, the split decision,
the first shard requested and delivered, the first batch), each with the time it took. A
program shows them with ``logging.getLogger("hapi_client.status").setLevel(logging.INFO)`` and a
handler; ``hapi finetune`` prints them unless ``--quiet``.

**Progress** (:func:`progress_bar`): a tqdm bar on a terminal; elsewhere (a log file, a pipe)
one plain line every :data:`LINE_STEP_PERCENT` percent instead of tqdm's ``\\r`` redraws.

:func:`quiet_http_warnings` turns the retry chatter of urllib3 and swiftclient into debug records:
the client retries on its own budget and says so once (:mod:`hapi_client.retry`).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Protocol, TextIO

from tqdm import tqdm

__all__ = [
    "LINE_STEP_PERCENT",
    "LineProgress",
    "Progress",
    "progress_bar",
    "quiet_http_warnings",
    "status",
]

#: The logger of the status lines.
status = logging.getLogger("hapi_client.status")

#: Percent of an epoch between two plain progress lines (not on a terminal).
LINE_STEP_PERCENT = 5


class Progress(Protocol):
    def update(self, n: int = 1) -> Any: ...
    def set_postfix(self, **values: Any) -> Any: ...
    def close(self) -> Any: ...


class LineProgress:
    """Progress as plain lines: ``desc: 25% (15/60 it, 10.2 s, sps=120)`` every ``step`` percent
    and at the end; nothing when disabled."""

    def __init__(
        self,
        total: int,
        desc: str,
        stream: TextIO,
        *,
        step: int = LINE_STEP_PERCENT,
        disable: bool = False,
    ) -> None:
        self.total = max(0, total)
        self.desc = desc
        self.stream = stream
        self.step = max(1, step)
        self.disable = disable
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self._start = time.perf_counter()
        self._shown = -1  # last percent step written
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        percent = 100 * self.n // self.total if self.total else 100
        if self._shown < 0 or percent // self.step > self._shown // self.step:
            self._write(percent)

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        percent = 100 * self.n // self.total if self.total else 100
        if percent != self._shown:
            self._write(percent)

    def _write(self, percent: int) -> None:
        self._shown = percent
        if self.disable:
            return
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        seconds = time.perf_counter() - self._start
        print(
            f"{self.desc}: {percent}% ({self.n}/{self.total} it, {seconds:.1f} s{extra})",
            file=self.stream,
            flush=True,
        )


def progress_bar(
    total: int, desc: str, *, enabled: bool = True, stream: TextIO | None = None
) -> Progress:
    """A tqdm bar on ``stream`` (default stderr) when it is a terminal, else plain lines."""
    out = stream if stream is not None else sys.stderr
    if enabled and _is_terminal(out):
        return tqdm(total=total, desc=desc, unit="it", file=out, leave=True)
    return LineProgress(total, desc, out, disable=not enabled)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _AtDebug(logging.Filter):
    """Re-level a record to DEBUG, and let it through only where DEBUG is enabled."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_QUIETED = ("urllib3.connectionpool", "urllib3.util.retry", "swiftclient")


def quiet_http_warnings() -> None:
    """Log urllib3's and swiftclient's retry warnings at debug level (idempotent)."""
    for name in _QUIETED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _AtDebug) for f in logger.filters):
            logger.addFilter(_AtDebug())
