"""``hapi bench inplace``: its registration and its report section (no stack: a made-up run)."""

from __future__ import annotations

from pathlib import Path

from hapi_bench import SCENARIOS, ResultSet, write_report


def _row(layout: str, read_s: float, server_s: float, concurrency: int) -> dict[str, object]:
    return {
        "layout": layout,
        "images": 100,
        "requests": 3,
        "server_s": server_s,
        "server_images_per_s": 100 / server_s,
        "read_s": read_s,
        "decode_compute_s": 2.5,
        "concurrency": concurrency,
        "pipelined_images_per_s": 100 / server_s,
        "stored_mb": 11.0,
    }


def test_the_scenario_runs_on_the_testbed() -> None:
    scenario = SCENARIOS["inplace"]
    assert scenario.testbed and scenario.entry == "hapi_bench.scenario_in_place:run_in_place"


def test_the_report_shows_both_layouts_and_the_ratio(tmp_path: Path) -> None:
    results = ResultSet.start("inplace", arch="resnet18", split=7, goal_ratio=0.8)
    results.add(_row("shards", 0.05, 2.5, 1))
    results.add(_row("folder", 0.5, 3.125, 16))
    results.meta.update(ratio=0.8, pipelined_ratio=0.8)
    results.write(tmp_path)
    text = write_report(tmp_path, tmp_path / "results.md").read_text()
    section = text[text.index("## Datasets indexed in place") :]
    assert "| shards | 100 | 11 | 1 | 0.05 | 2.5 | 2.5 | 40 | 40 |" in section
    assert "| folder | 100 | 11 | 16 | 0.5 | 2.5 | 3.12 | 32 | 32 |" in section
    assert "**0.80x**" in section and "goal >= 0.8" in section
