"""The code and docs cite sources a reader of the repository can open.

Sources are cited by title, chapter, section, equation and table, as listed in
``docs/references.md``; never by raw line numbers of a text file outside the repository
(``[000:1487]``) nor by the sections of a digest that is not in it (``digest D6``).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.project import PACKAGES

ROOT = Path(__file__).resolve().parent.parent

#: What a reader cannot open: a line of a seed file, a section of the seeds' digest.
FORBIDDEN = re.compile(r"\[00\d:|digest D\d|DESIGN\.md|seeds-digest")

#: Folders and top-level files searched: every package, the examples, the docs and the tests.
SEARCHED = (*PACKAGES.values(), "examples", "docs", "tests", "README.md")
SUFFIXES = {".py", ".md", ".rst", ".txt", ".toml", ".yml", ".yaml"}


def searched_files() -> list[Path]:
    files: list[Path] = []
    for name in SEARCHED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    return [p for p in files if p != Path(__file__).resolve()]


def test_the_references_exist_and_are_searched() -> None:
    references = ROOT / "docs" / "references.md"
    assert references in searched_files()
    text = references.read_text(encoding="utf-8")
    assert "System Support for Robust Distributed Learning" in text
    assert "| R5 |" in text


def test_no_citation_points_outside_the_repository() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in searched_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not hits, "cite docs/references.md instead:\n" + "\n".join(hits)
