"""Files written whole: a reader sees the old content or the new, never a part.

The lowest layer owns it so that every package above can write through the same code: the
listing cache here, checkpoints and the feature cache in :mod:`hapi_client`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(
    path: Path, data: bytes, *, prefix: str | None = None, suffix: str = ".tmp"
) -> None:
    """``path`` holds ``data`` or what it held before, never a part: temp file, fsync, rename.

    The temporary file is ``prefix`` (default ``.NAME.``) + random + ``suffix`` in ``path``'s
    directory, so a store that sweeps leftovers of a crash can recognise them by name.
    """
    prefix = f".{path.name}." if prefix is None else prefix
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
