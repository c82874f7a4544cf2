"""The parser machinery every ``hapi`` command shares.

:class:`HapiArgumentParser` is the class of the top-level parser and, through
``add_subparsers``, of every subcommand's parser, however deep; command modules add their parsers
with ``subparsers.add_parser`` as usual and get all of this without asking:

- the global options (``--debug``, ``-v/--verbose``) on every (sub)command, so that
  ``hapi upload model ... --debug`` works as well as ``hapi --debug upload model ...``.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["HapiArgumentParser", "add_global_options"]


def add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Add ``--debug`` and ``-v/--verbose``; on a subcommand (``top=False``) without defaults.

    A subcommand's parser fills a namespace of its own that argparse copies over the top-level
    one: with a default of False there, ``hapi --debug CMD`` would lose its ``--debug``. So only
    the top-level parser sets the defaults, and a subcommand sets the flag only when given.
    """
    default: Any = False if top else argparse.SUPPRESS
    group = parser.add_argument_group("global options (anywhere on the command line)")
    group.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="debug logs, and tracebacks instead of one-line errors",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="log progress (INFO) to stderr",
    )


class _SubParsers(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose parsers get the global options."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = super().add_parser(name, **kwargs)
        add_global_options(parser, top=False)
        return parser


class HapiArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose subcommands (and theirs) are HapiArgumentParsers too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubParsers)
