"""Every option of every ``hapi`` (sub)command has help text, and its help shows its default.

``_NOT_YET`` lists commands whose options do not all have help yet (none now: ``hapi finetune``,
with ``hapi_cli.workers``' multi-worker group, has them since issue 21, point 4).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from hapi_cli.main import build_parser

#: Commands whose options do not all have help yet (see the module's docstring).
_NOT_YET: set[tuple[str, ...]] = set()


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


_ALL = list(_parsers(build_parser()))


def _shows_default(action: argparse.Action) -> bool:
    return not (
        action.default is None or action.default is argparse.SUPPRESS or action.default is False
    )


@pytest.mark.parametrize(
    ("path", "parser"),
    [(p, parser) for p, parser in _ALL if p not in _NOT_YET],
    ids=[" ".join(p) or "hapi" for p, _ in _ALL if p not in _NOT_YET],
)
def test_every_option_has_help_and_shows_its_default(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    formatter = parser._get_formatter()
    problems = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        help_text = formatter._expand_help(action) if action.help else ""
        # The help must say more than its default.
        if not re.sub(r"\(?default: [^)]*\)?", "", help_text).strip(" ;,"):
            problems.append(f"{name}: no help text")
        elif _shows_default(action) and "default" not in help_text.lower():
            problems.append(f"{name}: the help does not show the default {action.default!r}")
    assert not problems, f"hapi {' '.join(path)}: " + "; ".join(problems)


def test_every_parser_refuses_prefixes() -> None:
    for path, parser in _ALL:
        assert parser.allow_abbrev is False, f"hapi {' '.join(path)} takes prefixes of options"


def test_the_walk_reaches_every_command() -> None:
    paths = {p for p, _ in _ALL}
    assert {("stack", "up"), ("upload", "model"), ("upload", "dataset"), ("bench",)} <= paths
    assert {("finetune",)} <= paths and _NOT_YET <= paths
