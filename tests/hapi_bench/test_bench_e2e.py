"""A tiny ``e2e`` run against the real stack writes JSON and CSV with every field."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hapi_bench import run_job

FIELDS = {
    "model",
    "mode",
    "rate_target_mbit",
    "rate_measured_mbit",
    "rate_flagged",
    "link",
    "dataset",
    "stored_bytes_per_sample",
    "batch_size",
    "split_index",
    "epoch_s",
    "bytes_per_iteration",
    "client_cpu_s",
    "storage_cpu_s",
    "network_s",
    "lower_bound_s",
    "bound_ratio",
    "bound_limiter",
}
CSV_META = {"machine", "torch", "swift", "hapi", "link", "cores"}


@pytest.mark.slow
def test_tiny_e2e_run_writes_every_field(tmp_path: Path) -> None:
    out = tmp_path / "results"
    code = run_job(
        "hapi_bench.scenario_e2e:run_e2e",
        {"out_dir": str(out), "quick": True, "tiny": True},
        tmp_path / "state",
    )
    assert code == 0
    data = json.loads((out / "e2e.json").read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["machine"]["versions"]["torch"] and meta["testbed"]["cores"]["client"]
    assert meta["link_checks"] and meta["link_checks"][0]["target_mbit"] == 100.0
    assert {r["mode"] for r in rows} == {"baseline", "hapi", "all_in_cos"}
    for row in rows:
        missing = FIELDS - {k for k, v in row.items() if v is not None}
        assert not missing, (row["mode"], missing)
        assert row["lower_bound_s"] > 0 and row["epoch_s"] > 0
        assert row["stored_bytes_per_sample"] > 50_000
    hapi = next(r for r in rows if r["mode"] == "hapi")
    base = next(r for r in rows if r["mode"] == "baseline")
    assert 0 <= hapi["split_index"] <= hapi["freeze_index"]
    # The default rule's promise is time, not bytes: it names what it predicted.
    assert "predicted" in hapi["split_reason"] and "runner-up" in hapi["split_reason"]
    assert base["split_index"] == 0
    assert hapi["fill_s"] > 0 and base["fill_s"] > 0  # the pipeline fill, reported apart
    regime = meta["regimes"]["efficientnet_lite0"]
    assert regime["crossover_mbit"] > 0 and regime["compute_s"] > 0
    with (out / "e2e.csv").open() as handle:
        csv_rows = list(csv.DictReader(handle))
    assert len(csv_rows) == len(rows)
    assert FIELDS | CSV_META <= set(csv_rows[0])
    assert (out / "e2e.png").stat().st_size > 0
