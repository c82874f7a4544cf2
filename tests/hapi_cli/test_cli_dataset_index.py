"""``hapi dataset index``'s parser and its usage errors (no Swift needed; the rest is in
``tests/hapi_client/datasets/test_index_swift.py``)."""

from __future__ import annotations

import pytest

from hapi_cli.main import main


def test_help_names_the_layouts_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dataset", "index", "--help"]) == 0
    out = capsys.readouterr().out
    for option in (
        "--container",
        "--prefix",
        "--labels",
        "--label-field",
        "--into",
        "--shard-size",
        "--strict",
    ):
        assert option in out
    assert "{folder,webdataset}" in out and "Nothing in the data container is written" in out
    assert ".DS_Store" in out and "refused with --strict" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dataset"], "ACTION"),
        (["dataset", "index", "--layout", "folder"], "--container"),
        (["dataset", "index", "--container", "c", "--layout", "shards"], "invalid choice"),
        (["dataset", "index", "--container", "c", "--layout", "foldr"], "did you mean 'folder'"),
        (
            ["dataset", "index", "--container", "c", "--layout", "folder", "--label-field", "y"],
            "a label field is for the webdataset layout",
        ),
        (
            ["dataset", "index", "--container", "c", "--layout", "webdataset", "--labels", "l.csv"],
            "a labels object is for the folder layout",
        ),
        (
            ["dataset", "index", "--container", "c/d", "--layout", "folder"],
            "invalid container name",
        ),
        (
            ["dataset", "index", "--container", "c", "--layout", "folder", "--shard-size", "0"],
            "shard size must be >= 1",
        ),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
