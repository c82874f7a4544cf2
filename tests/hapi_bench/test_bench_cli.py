"""``hapi bench`` and ``hapi demo`` on the command line (no stack: listing, reports, errors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hapi_bench import ORDER, ResultSet

from hapi_cli.main import main


def test_bench_list_names_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "list"]) == 0
    out = capsys.readouterr().out
    names = {
        "e2e",
        "split",
        "tenants",
        "adaptation",
        "gars",
        "startup",
        "backbones",
        "oracle",
        "jobsplit",
        "proxy",
        "inplace",
        "sweep",
        "roofline",
    }
    for name in names:
        assert name in out
    assert set(ORDER) == names


def test_bench_rejects_an_unknown_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_bench_report_writes_markdown_from_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = ResultSet.start(
        "proxy", testbed={"link": "netns"}, unavailable="no in-proxy execution"
    )
    results.write(tmp_path)
    out = tmp_path / "docs" / "results.md"
    assert main(["bench", "report", "--out", str(tmp_path), "--output", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    text = out.read_text()
    assert text.startswith("# Results") and "Not available: no in-proxy execution" in text
    assert "Tesla T4" in text  # the thesis' hardware, beside ours
    # Without --output the report goes into the results folder, never over docs/results.md.
    assert main(["bench", "report", "--out", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'results.md'}" in capsys.readouterr().out
    assert (tmp_path / "results.md").read_text() == text


def test_demo_help_describes_the_link(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--keep" in out and "token bucket" in out and "--rate" in out
