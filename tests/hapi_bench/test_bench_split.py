"""The quick ``split`` scenario writes its files, and its choices move the way Table 5.3 does."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from hapi_bench.scenario_split import run_split


def test_quick_split_scenario_writes_json_csv_and_plot(tmp_path: Path) -> None:
    assert run_split(str(tmp_path), quick=True) == 0
    for name in ("split.json", "split.csv", "split.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    data = json.loads((tmp_path / "split.json").read_text())
    assert data["meta"]["dataset"]["stored_bytes_per_sample"] > 50_000  # ImageNet-sized JPEGs
    rows = data["rows"]
    assert len(list(csv.DictReader((tmp_path / "split.csv").open()))) == len(rows)
    alexnet = sorted((r for r in rows if r["model"] == "alexnet" and r["sweep"] == "bandwidth"),
                     key=lambda r: r["bandwidth_gbit"])
    splits = [r["split_index"] for r in alexnet]
    assert splits[0] == alexnet[0]["freeze_index"] == 17  # the freeze index at 50 Mbit/s
    assert splits == sorted(splits, reverse=True)  # more bandwidth never moves the split later
    assert all(s <= 17 for s in splits)
    # Where the thesis and we use the same rule on the same layers, the choices agree.
    assert [r["split_index"] for r in alexnet if r["bandwidth_gbit"] <= 2] == [
        r["thesis_split_index"] for r in alexnet if r["bandwidth_gbit"] <= 2
    ]
    by_batch = sorted((r for r in rows if r["model"] == "alexnet" and r["sweep"] == "batch"),
                      key=lambda r: r["batch_size"])
    batch_splits = [r["split_index"] for r in by_batch]
    assert batch_splits == sorted(batch_splits)  # a larger batch never moves the split earlier
