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


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_prefix_is_not_taken_for_an_option(capsys: pytest.CaptureFixture[str]) -> None:
    # --epoch used to be taken for --epochs; now it is an error that proposes --epochs.
    err = _usage_error(["finetune", "--model", "m", "--container", "c", "--epoch", "1"], capsys)
    assert err == (
        "hapi finetune: error: unrecognized arguments: --epoch 1 (--epoch: did you mean --epochs?)"
    )
    err = _usage_error(["stack", "up", "--time", "5"], capsys)
    assert err.startswith("hapi stack up: error: unrecognized arguments: --time 5")


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["finetune", "--model", "m", "--container", "c", "--batchsize", "8"], "--batch-size"),
        (["finetune", "--model", "m", "--container", "c", "--batchsize=8"], "--batch-size"),
        (["upload", "model", "--arch", "alexnet", "--containr", "x"], "--container"),
        (["--debugg", "stack", "up"], "--debug"),
        (["stack", "up", "--proxyport", "1"], "--proxy-port"),
    ],
)
def test_a_near_miss_gets_a_suggestion(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert f"did you mean {hint}?" in _usage_error(argv, capsys)


def test_an_invalid_choice_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    # --arch is checked by the registry (eighty-odd names and timm's), before connecting.
    err = _usage_error(["upload", "model", "--arch", "resnet5"], capsys)
    assert "unknown model 'resnet5'; did you mean 'resnet50'?" in err
    assert _usage_error(["finetun"], capsys).endswith("(did you mean 'finetune'?)")
    # Nothing close: argparse's message alone.
    assert _usage_error(["stack", "down", "--zzz"], capsys).endswith(
        "unrecognized arguments: --zzz"
    )
