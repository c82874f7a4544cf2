"""The ``hapi`` command: one subcommand per module listed in :data:`COMMAND_MODULES`.

A command module exposes ``register(subparsers) -> None``, which adds its parser and sets
``func`` (``func(args) -> int``, the exit code) with ``set_defaults``. It may also define
``ERRORS``, a tuple of exception types to report as user-facing errors; exceptions defined in
the project's own packages (``hapi_*``, ``swift_middleware``) count as such anyway, by the name of
their module, so that none has to be imported to be recognised.

Every command module is imported to build the parser, for ``hapi --help`` and usage errors too:
none may import torch at its top (``tests/hapi_cli/test_cli_startup.py`` checks). Handlers import
the heavy packages they use; parsers take their choices and defaults from :mod:`hapi_cli.choices`.

Exit codes: 0 success, 1 failure reported by the command or unexpected error, 2 usage or library
error (one line on stderr; ``--debug``, anywhere on the command line, shows the traceback
instead), 130 interrupted. The parsers' shared machinery is :mod:`hapi_cli.parsers`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from hapi_stack import shared_host_env

from .parsers import HapiArgumentParser, add_global_options

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

#: Modules that provide subcommands; those not written yet are skipped.
COMMAND_MODULES = [
    "hapi_cli.stack_cmd",
    "hapi_cli.upload_cmd",
    "hapi_cli.dataset_cmd",
    "hapi_cli.model_cmd",
    "hapi_cli.models_cmd",
    "hapi_cli.finetune_cmd",
    "hapi_cli.demo_cmd",
    "hapi_cli.bench_cmd",
]

_PROJECT_PACKAGES = ("hapi_", "swift_middleware")


def _command_modules() -> list[ModuleType]:
    return [
        importlib.import_module(name)
        for name in COMMAND_MODULES
        if importlib.util.find_spec(name) is not None
    ]


def build_parser(modules: Sequence[ModuleType] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with the subcommands of ``modules`` (default: all available)."""
    parser = HapiArgumentParser(
        prog="hapi",
        description="HAPI: split transfer learning between OpenStack Swift and the compute tier.",
    )
    add_global_options(parser, top=True)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules() if modules is None else modules:
        module.register(subparsers)
    return parser


def _is_library_error(exc: BaseException, extra: tuple[type[BaseException], ...]) -> bool:
    if isinstance(exc, extra):
        return True
    return any(cls.__module__.startswith(_PROJECT_PACKAGES) for cls in type(exc).__mro__)


def _configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hapi`` command with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    modules = _command_modules()
    parser = build_parser(modules)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has already explained
        return exc.code if isinstance(exc.code, int) else 2
    _configure_logging(args)
    # Before any handler imports torch: libgomp reads it once, at load (hapi_stack._threads).
    os.environ.update(shared_host_env())
    extra: tuple[type[BaseException], ...] = tuple(
        err for module in modules for err in getattr(module, "ERRORS", ())
    )
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("hapi: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        if _is_library_error(exc, extra):
            print(f"hapi: error: {exc}", file=sys.stderr)
            return 2
        print(
            f"hapi: unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
