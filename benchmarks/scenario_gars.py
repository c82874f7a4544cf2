"""``gars``: aggregation-rule timing, by ``benchmarks/gars.py`` (the robust aggregation micro-benchmark).

``gars.py`` writes ``gars.json`` in its own format (``meta`` + ``results``); this adds the CSV
and the plot next to it.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import gars
from .machine import machine_info
from .plots import plot_gars
from .results import ResultSet

__all__ = ["run_gars"]


def run_gars(out_dir: str, quick: bool = True) -> int:
    """Run ``gars.py`` (``--quick`` when quick) into ``out_dir``; add ``gars.csv`` and ``gars.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gars.json"
    code = gars.main([*(["--quick"] if quick else []), "--out", str(path)])
    data = json.loads(path.read_text())
    results = ResultSet("gars", {**data["meta"], "machine": machine_info()}, data["results"])
    csv_path = out / "gars.csv"
    # Write the CSV through a copy so that gars.py's own JSON stays as it wrote it.
    ResultSet("gars-csv", results.meta, results.rows).write(out)
    (out / "gars-csv.csv").replace(csv_path)
    (out / "gars-csv.json").unlink(missing_ok=True)
    plot_gars(results, out)
    print(f"[gars] wrote {path}, {csv_path}, {out / 'gars.png'}", flush=True)
    return code
