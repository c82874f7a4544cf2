"""The parser machinery every ``hapi`` command shares.

:class:`HapiArgumentParser` is the class of the top-level parser and, through
``add_subparsers``, of every subcommand's parser, however deep; command modules add their parsers
with ``subparsers.add_parser`` as usual and get all of this without asking:

- no prefix matching (``allow_abbrev=False``): ``--epoch`` is not taken for ``--epochs``;
- a suggestion for a near-miss, from :mod:`difflib`, in the usage error of the (sub)command
  that was given it: an unknown option (``--batchsize``: did you mean ``--batch-size``?) or an
  invalid choice (``--arch resnet5``, ``hapi finetun``);
- every option's default in its help (:class:`DefaultsHelpFormatter`), unless the help text
  already says what the default is;
- the global options (``--debug``, ``-v/--verbose``) on every (sub)command, so that
  ``hapi upload model ... --debug`` works as well as ``hapi --debug upload model ...``.

Parent parsers (options shared by several commands) are made with :func:`parent_parser`.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

__all__ = [
    "DefaultsHelpFormatter",
    "HapiArgumentParser",
    "RawDescriptionDefaultsHelpFormatter",
    "add_global_options",
    "parent_parser",
    "suggestion",
]

#: Where the parser that left arguments unrecognised waits in the namespace for parse_args.
_UNRECOGNISED_BY = "_hapi_unrecognised_by"
_UNRECOGNISED = "unrecognized arguments: "
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already names its default.

    Nothing is added for a default of None (the help says what happens instead), for a flag's
    False, or for an option without help text (``tests/hapi_cli/test_cli_help.py`` finds those).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help
        if not help_text or "default" in help_text.lower():
            return help_text
        default = action.default
        if default is None or default is argparse.SUPPRESS or default is False:
            return help_text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{help_text} (default: %(default)s)"
        return help_text


class RawDescriptionDefaultsHelpFormatter(
    argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter
):
    """:class:`DefaultsHelpFormatter` that keeps the description's and epilog's line breaks."""


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


def suggestion(given: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``given``, if one is close enough to be a likely typo."""
    close = difflib.get_close_matches(given, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


class _SubParsers(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose parsers get the global options."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = super().add_parser(name, **kwargs)
        add_global_options(parser, top=False)
        return parser


class HapiArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser without prefix matching, with suggestions and defaults in its help.

    Its subcommands (and theirs) are HapiArgumentParsers too, with the global options.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubParsers)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # The innermost parser returns first: it is the one whose options a near-miss was for.
        if extras and not hasattr(parsed, _UNRECOGNISED_BY):
            setattr(parsed, _UNRECOGNISED_BY, self)
        return parsed, extras

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        by: argparse.ArgumentParser = vars(parsed).pop(_UNRECOGNISED_BY, self)
        if extras:
            by.error(_UNRECOGNISED + " ".join(extras))
        return parsed

    def error(self, message: str) -> NoReturn:
        """argparse's usage error, with the closest option or choice proposed."""
        hint = self._hint(message)
        super().error(f"{message} ({hint})" if hint else message)

    def _hint(self, message: str) -> str | None:
        if message.startswith(_UNRECOGNISED):
            options = [o for o in self._option_string_actions if o.startswith("--")]
            hints = []
            for given in message.removeprefix(_UNRECOGNISED).split():
                if given.startswith("-") and (close := suggestion(given.split("=")[0], options)):
                    hints.append(f"{given.split('=')[0]}: did you mean {close}?")
            return "; ".join(hints) or None
        if match := _INVALID_CHOICE.search(message):
            choices = re.findall(r"'([^']*)'", match["choices"])
            close = suggestion(match["given"], choices)
            return f"did you mean {close!r}?" if close else None
        return None


def parent_parser() -> argparse.ArgumentParser:
    """A parser of options shared by several commands, for ``add_parser(parents=[...])``."""
    return HapiArgumentParser(add_help=False)
