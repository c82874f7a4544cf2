"""The local progress of one in-place index run, so that a second run continues the first.

A run is identified by its *fingerprint* (the Swift account, the containers, the prefix, the
layout and every option that changes the result); its state lives in a directory of its own
(default: ``$XDG_CACHE_HOME/hapi/index/<hash of the fingerprint>``) and holds:

* ``listing.tsv``: the listing so far, one object a line (``name``, ``etag``, ``bytes``,
  ``class``, tab-separated: names holding control characters, tabs included, are refused before
  they get here), appended page by page. It is what keeps memory bounded: the indexer never holds
  the listing in memory, only offsets into this file;
* ``state.json``: the fingerprint, the listing's ``marker`` (the last name listed), the length of
  ``listing.tsv`` at that marker, whether the listing is complete, and the objects skipped so far
  (their count and the first :data:`SKIPPED_EXAMPLES` names); written atomically after each
  page, so a crash mid-page loses that page only (the file is cut back to the length);
* ``done.jsonl``: one JSON line per finished unit of the second phase (a part written, or a
  WebDataset shard read and counted), appended as each finishes.

The directory is removed when the manifest has been written: a later run lists afresh, so that it
sees what changed in the container.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hapi_contract.dataset import MAX_SKIPPED_EXAMPLES

__all__ = ["SKIPPED_EXAMPLES", "IndexState", "default_state_dir"]

logger = logging.getLogger(__name__)

_LISTING = "listing.tsv"
_STATE = "state.json"
_DONE = "done.jsonl"

#: How many skipped names a run keeps (the manifest lists as many): the count is always exact,
#: but a container of a million stray objects must not make a manifest of a million names.
SKIPPED_EXAMPLES = MAX_SKIPPED_EXAMPLES


def default_state_dir(fingerprint: dict[str, Any]) -> Path:
    """Where the state of the run with ``fingerprint`` lives by default."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode("utf-8")).hexdigest()
    return cache / "hapi" / "index" / digest[:20]


class IndexState:
    """The state directory of one run (created on demand); see the module docstring."""

    def __init__(self, directory: Path, fingerprint: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.fingerprint = fingerprint
        self.marker = ""
        self.listing_complete = False
        self.resumed = False
        self.skipped_count = 0
        self.skipped_examples: list[str] = []
        self._listing_bytes = 0
        self._load()

    @property
    def listing_path(self) -> Path:
        """The listing spool (``listing.tsv``)."""
        return self.directory / _LISTING

    def _load(self) -> None:
        state_file = self.directory / _STATE
        try:
            saved = json.loads(state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            saved = None
        except (OSError, ValueError) as exc:
            logger.warning("%s: unreadable (%s); starting over", state_file, exc)
            saved = None
        if saved is not None and saved.get("fingerprint") != self.fingerprint:
            logger.info("%s: left by a run with other options; starting over", self.directory)
            saved = None
        if saved is None:
            self.clear()
            self.directory.mkdir(parents=True, exist_ok=True)
            self.listing_path.write_bytes(b"")
            self._save()
            return
        self.marker = str(saved["marker"])
        self.listing_complete = bool(saved["listing_complete"])
        self._listing_bytes = int(saved["listing_bytes"])
        # .get: a state left by a version that did not keep them.
        self.skipped_count = int(saved.get("skipped_count", 0))
        self.skipped_examples = [str(name) for name in saved.get("skipped_examples", [])]
        self.resumed = True
        # Cut off a page appended after the last saved state (the run stopped mid-page).
        with open(self.listing_path, "ab") as spool:
            spool.truncate(self._listing_bytes)
        done_file = self.directory / _DONE
        if done_file.exists():
            # A unit cut off mid-line is redone: drop its partial line before appending more.
            data = done_file.read_bytes()
            done_file.write_bytes(data[: data.rfind(b"\n") + 1])
        logger.info(
            "%s: continuing an earlier run (listed up to %r%s)",
            self.directory,
            self.marker,
            ", listing complete" if self.listing_complete else "",
        )

    def _save(self) -> None:
        body = {
            "fingerprint": self.fingerprint,
            "marker": self.marker,
            "listing_bytes": self._listing_bytes,
            "listing_complete": self.listing_complete,
            "skipped_count": self.skipped_count,
            "skipped_examples": self.skipped_examples,
        }
        temporary = self.directory / (_STATE + ".tmp")
        temporary.write_text(json.dumps(body), encoding="utf-8")
        os.replace(temporary, self.directory / _STATE)

    def append_page(
        self, lines: list[str], marker: str, *, complete: bool, skipped: Sequence[str] = ()
    ) -> None:
        """Add one listing page's lines and move the marker past it (atomically, as one step).

        ``skipped``: the names of the page's objects that the index leaves out.
        """
        with open(self.listing_path, "ab") as spool:
            spool.write("".join(lines).encode("utf-8"))
            self._listing_bytes = spool.tell()
        self.skipped_count += len(skipped)
        room = SKIPPED_EXAMPLES - len(self.skipped_examples)
        self.skipped_examples += list(skipped[:room])
        self.marker = marker
        self.listing_complete = complete
        self._save()

    def listing(self) -> Iterator[tuple[int, bytes]]:
        """``(offset, line)`` of each spooled line, the newline stripped, in listing order."""
        offset = 0
        with open(self.listing_path, "rb") as spool:
            for line in spool:
                yield offset, line.rstrip(b"\n")
                offset += len(line)

    def done(self) -> list[dict[str, Any]]:
        """The finished units recorded so far, in the order they finished."""
        try:
            text = (self.directory / _DONE).read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines()]

    def record_done(self, unit: dict[str, Any]) -> None:
        """Record one finished unit."""
        with open(self.directory / _DONE, "a", encoding="utf-8") as done:
            done.write(json.dumps(unit, sort_keys=True) + "\n")

    def clear(self) -> None:
        """Remove the state directory (after success, or to start over)."""
        shutil.rmtree(self.directory, ignore_errors=True)
