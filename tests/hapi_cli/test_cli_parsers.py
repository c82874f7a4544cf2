"""The parser machinery every ``hapi`` command shares (``hapi_cli.parsers``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hapi_cli.main import build_parser, main


@pytest.mark.parametrize(
    "argv",
    [
        ["--debug", "stack", "up"],
        ["stack", "up", "--debug"],
        ["stack", "--debug", "up"],
        ["upload", "model", "--arch", "alexnet", "--debug"],
        ["--debug", "upload", "model", "--arch", "alexnet"],
    ],
)
def test_debug_is_accepted_anywhere(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.debug is True and args.verbose is False


def test_global_options_default_off_and_verbose_anywhere() -> None:
    parser = build_parser()
    args = parser.parse_args(["upload", "model", "--arch", "alexnet"])
    assert args.debug is False and args.verbose is False
    args = parser.parse_args(["upload", "model", "-v", "--arch", "alexnet"])
    assert args.verbose is True and args.debug is False


@pytest.mark.parametrize("where", ["first", "last"])
def test_the_hint_run_with_debug_works_when_appended(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.pth"
    path.write_text("not weights\n")
    argv = ["upload", "model", "--arch", "resnet18", "--weights", str(path)]
    assert main(argv) == 2  # without --debug: one line
    assert capsys.readouterr().err.count("\n") == 1
    import hapi_models

    with pytest.raises(hapi_models.CheckpointError):  # with it: the exception, for a traceback
        main(["--debug", *argv] if where == "first" else [*argv, "--debug"])
