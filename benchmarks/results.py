"""Result files: ``SCENARIO.json`` (meta + rows) and ``SCENARIO.csv`` (rows with the meta columns).

Every file says what it was measured on: the JSON's ``meta`` holds the machine, the versions, the
testbed (link kind, cores) and the scenario's options; every CSV row repeats the machine, the
versions and the link so that a row read on its own is still complete.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ScenarioError
from .machine import machine_info

__all__ = ["DEFAULT_OUT", "ResultSet", "load_results"]

DEFAULT_OUT = Path("bench-results")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class ResultSet:
    """The rows of one scenario and what they were measured on."""

    scenario: str
    meta: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, scenario: str, **meta: Any) -> ResultSet:
        # The load average says whether anything else competed for the cores meanwhile.
        return cls(
            scenario,
            {
                "scenario": scenario,
                "started": _now(),
                "machine": machine_info(),
                "load_average_start": os.getloadavg(),
                **meta,
            },
        )

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def _csv_meta(self) -> dict[str, Any]:
        machine = self.meta.get("machine", {})
        if not isinstance(machine, dict):  # a foreign file (gars.py) names only the architecture
            machine = {"cpu": machine}
        versions = machine.get("versions", {})
        testbed = self.meta.get("testbed", {})
        return {
            "machine": f"{machine.get('cpu', '?')} x{machine.get('cores', '?')}, "
            f"{machine.get('memory_gib', '?')} GiB, {machine.get('gpu') or 'no GPU'}",
            "python": machine.get("python"),
            "torch": versions.get("torch"),
            "torchvision": versions.get("torchvision"),
            "swift": versions.get("swift"),
            "hapi": versions.get("hapi"),
            "link": testbed.get("link"),
            "cores": testbed.get("cores_note"),
        }

    def write(self, out_dir: Path) -> list[Path]:
        """Write ``SCENARIO.json`` and ``SCENARIO.csv`` under ``out_dir``; return their paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.meta["finished"] = _now()
        self.meta["load_average_end"] = os.getloadavg()
        json_path = out_dir / f"{self.scenario}.json"
        json_path.write_text(
            json.dumps({"meta": self.meta, "rows": self.rows}, indent=2, default=str) + "\n"
        )
        csv_path = out_dir / f"{self.scenario}.csv"
        extra = self._csv_meta()
        columns: list[str] = []
        for row in self.rows:
            columns += [k for k in row if k not in columns and not isinstance(row[k], dict | list)]
        columns += [k for k in extra if k not in columns]
        with csv_path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for row in self.rows:
                writer.writerow({**extra, **row})
        return [json_path, csv_path]


def load_results(out_dir: Path, scenario: str) -> ResultSet | None:
    """The results a scenario wrote to ``out_dir``, or None if it has not run."""
    path = out_dir / f"{scenario}.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return ResultSet(scenario, data["meta"], data["rows"])
    except (ValueError, KeyError) as exc:
        raise ScenarioError(f"{path} is not a result file: {exc}") from exc
