"""``hapi --help``, every ``hapi CMD --help`` and usage errors do not import torch.

They run in a fresh interpreter (this test process may have torch loaded already), one after the
other; after each the child records whether torch or torchvision is loaded, so a failure names the
first command that loaded it. ``benchmarks/startup.py`` measures what this saves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from hapi_cli.main import _is_library_error, build_parser, main

# What the child runs: each argv through hapi_cli.main.main, then which heavy modules are loaded.
_CHILD = """
import json, sys
from hapi_cli.main import main
records = []
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    records.append({"argv": argv, "code": code,
                    "heavy": sorted(m for m in ("torch", "torchvision") if m in sys.modules)})
print(json.dumps(records))
"""


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every (sub)command path of ``parser``: ("stack",), ("stack", "up"), ..."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


def _run_in_fresh_interpreter(argvs: list[list[str]]) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(argvs)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    records: list[dict[str, object]] = json.loads(out.stdout.strip().splitlines()[-1])
    return records


def test_every_command_module_is_registered() -> None:
    # A module that failed to import would be skipped silently and its --help never checked.
    top = {path[0] for path in _commands(build_parser())}
    assert {"stack", "upload", "finetune", "demo", "bench"} <= top


def test_help_and_usage_errors_do_not_import_torch() -> None:
    helps = [["--help"]] + [[*path, "--help"] for path in _commands(build_parser())]
    assert ["upload", "model", "--help"] in helps and ["stack", "up", "--help"] in helps
    usage_errors = [
        ["--no-such-option"],
        ["finetune", "--model", "models/alexnet", "--container", "c", "--bogus"],
        ["finetune", "--container", "c"],  # missing --model
        ["upload", "model"],  # missing --arch
        ["upload", "model", "--arch", "No Such Arch"],  # the form; the registry needs torch
        ["bench", "no-such-scenario"],
        ["finetune", "--model", "m", "--container", "c", "--mode", "nope"],
    ]
    records = _run_in_fresh_interpreter(helps + usage_errors)
    assert [r["argv"] for r in records] == helps + usage_errors
    for record in records:
        expected = 0 if record["argv"] in helps else 2
        assert record["code"] == expected, record
        assert record["heavy"] == [], f"`hapi {' '.join(record['argv'])}` loaded {record['heavy']}"  # type: ignore[arg-type]


def test_errors_of_lazily_imported_packages_are_still_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # DatasetError comes from hapi_client.datasets, imported only by the handler: it is known as a
    # user error by its package, not by a tuple imported when the parser is built.
    argv = ["upload", "dataset", "--source", "digits", "--container", "c", "--shard-size", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "hapi: error: --shard-size must be >= 1, got 0\n"


def test_library_errors_are_recognised_by_their_module_name() -> None:
    # Stand-ins named as if defined in the project's packages (nothing is imported for them).
    project = type("SomeError", (Exception,), {"__module__": "hapi_client.errors"})
    middleware = type("FilterError", (ValueError,), {"__module__": "swift_middleware.errors"})
    assert _is_library_error(project("x"), ())
    assert _is_library_error(middleware("x"), ())
    assert not _is_library_error(ValueError("x"), ())
    assert _is_library_error(KeyError("x"), (KeyError,))
