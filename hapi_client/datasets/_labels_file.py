"""A labels object for the folder layout: which class each image object belongs to.

Two formats, told apart by the first non-blank line (a JSON object, or not):

* CSV, two columns, ``object name,class name``; a first row ``name,class`` is a header;
* JSON Lines, one ``{"name": ..., "class": ...}`` per line.

Names are full object names in the data container (prefix included). The object is read in
chunks and parsed line by line: only the name -> class map is held, not the text.
"""

from __future__ import annotations

import csv
import json
import unicodedata
from collections.abc import Iterable, Iterator

from hapi_contract.dataset import object_name_problem

from .errors import DatasetIndexError

__all__ = ["MAX_CLASS_NAME_CHARS", "parse_labels"]

MAX_CLASS_NAME_CHARS = 256
_HEADER = ["name", "class"]


def _lines(chunks: Iterable[bytes], where: str) -> Iterator[str]:
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            yield _decode(raw, where)
    if pending:
        yield _decode(pending, where)


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError as exc:
        raise DatasetIndexError(f"{where}: not UTF-8 text ({exc})", object_name=where) from exc


def _row(line: str, as_json: bool, at: str, where: str) -> tuple[str, str] | None:
    if as_json:
        try:
            document = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetIndexError(f"{at}: not JSON ({exc})", object_name=where) from exc
        if not isinstance(document, dict) or not {"name", "class"} <= document.keys():
            raise DatasetIndexError(
                f'{at}: expected {{"name": ..., "class": ...}}', object_name=where
            )
        name, label = document["name"], document["class"]
        if not isinstance(name, str) or not isinstance(label, str | int):
            raise DatasetIndexError(
                f"{at}: name must be a string, class a string", object_name=where
            )
        return name, str(label)
    fields = next(csv.reader([line]))
    if [f.strip().lower() for f in fields] == _HEADER:
        return None
    if len(fields) != 2:
        raise DatasetIndexError(
            f"{at}: expected 2 columns (object name, class name), got {len(fields)}",
            object_name=where,
        )
    return fields[0], fields[1].strip()


def parse_labels(chunks: Iterable[bytes], where: str) -> dict[str, str]:
    """The object name -> class name map of a labels object read as ``chunks``.

    ``where`` (``container/name`` of the labels object) leads every error.

    Raises:
        DatasetIndexError: not UTF-8, a malformed line, a bad object name (dot segments, control
            characters), an empty or overlong class name, a name listed twice, or no entry.
    """
    labels: dict[str, str] = {}
    classes: dict[str, str] = {}
    as_json: bool | None = None
    for number, line in enumerate(_lines(chunks, where), start=1):
        if not line.strip():
            continue
        if as_json is None:
            as_json = line.lstrip().startswith("{")
        at = f"{where} line {number}"
        row = _row(line, as_json, at, where)
        if row is None:
            continue
        name, label = row
        problem = object_name_problem(name)
        if problem is not None:
            raise DatasetIndexError(f"{at}: {name!r}: {problem}", object_name=name)
        if not label or len(label) > MAX_CLASS_NAME_CHARS:
            raise DatasetIndexError(
                f"{at}: {name!r}: class name must be 1-{MAX_CLASS_NAME_CHARS} characters",
                object_name=name,
            )
        if any(unicodedata.category(char) == "Cc" for char in label):
            raise DatasetIndexError(
                f"{at}: {name!r}: control character in the class name", object_name=name
            )
        if name in labels:
            raise DatasetIndexError(f"{at}: {name!r} is listed twice", object_name=name)
        # One str per class, not per row: at ImageNet scale that is 1.28M strings saved.
        labels[name] = classes.setdefault(label, label)
    if not labels:
        raise DatasetIndexError(f"{where}: names no object", object_name=where)
    return labels
