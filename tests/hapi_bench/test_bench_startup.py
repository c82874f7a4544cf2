"""The ``startup`` scenario (``benchmarks/startup.py``): registered, and measuring real children."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from hapi_bench import ORDER, SCENARIOS
from hapi_bench.startup import commands, main, measure, run_startup


def test_startup_is_a_local_scenario_after_gars() -> None:
    scenario = SCENARIOS["startup"]
    assert not scenario.testbed and scenario.entry == "hapi_bench.startup:run_startup"
    assert ORDER.index("startup") == ORDER.index("gars") + 1
    assert list(inspect.signature(run_startup).parameters) == ["out_dir", "quick"]


def test_the_measured_commands() -> None:
    which = commands()
    assert list(which) == ["hapi --help", "import hapi_client", "import torch"]
    assert which["hapi --help"][-1] == "--help"


def test_measure_reports_each_child_s_own_wall_time_and_peak_rss() -> None:
    # A child that holds ~64 MiB more than a bare interpreter: its own ru_maxrss must show it, and
    # the bare one's must not (RUSAGE_CHILDREN would report the larger for both).
    big = [sys.executable, "-c", "b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096])"]
    bare = [sys.executable, "-c", "pass"]
    results = measure(1, {"big": big, "bare": bare, "fails": [sys.executable, "-c", "exit(3)"]})
    rows = {m.name: m.row() for m in results}
    assert rows["big"]["ok"] and rows["bare"]["ok"] and not rows["fails"]["ok"]
    assert rows["big"]["peak_rss_mib"] - rows["bare"]["peak_rss_mib"] > 48
    assert all(row["wall_s"] > 0 and row["runs"] == 1 for row in rows.values())


def test_main_writes_json_when_given_out(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import hapi_bench.startup as startup

    # The real commands take seconds each; one cheap child shows the file's layout.
    monkeypatch.setattr(startup, "commands", lambda: {"bare": [sys.executable, "-c", "pass"]})
    out = tmp_path / "s.json"
    assert main(["--runs", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["scenario"] == "startup" and data["meta"]["runs"] == 1
    assert [row["command"] for row in data["rows"]] == ["bare"]
