"""The ``jobsplit`` scenario's summary: each rule's job time over the best split's (no stack)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hapi_bench import ORDER, ResultSet, write_report
from hapi_bench.scenario_job_split import (
    PRUNE_OVER_BEST,
    _Cell,
    format_job_split,
    job_split_summary,
)
from hapi_bench.scenarios import SCENARIOS


def _row(rule: str, split: int, job: float, decided: float = 0.5) -> dict[str, object]:
    return {
        "dataset_label": "folder-12k",
        "model": "alexnet",
        "rate_target_mbit": 50.0,
        "rule": rule,
        "split_index": split,
        "job_s": job,
        "split_seconds": decided,
    }


def test_summary_judges_auto_freeze_and_baseline_by_the_whole_job() -> None:
    rows = [
        _row("auto", 14, 11.0, decided=0.4),
        _row("freeze", 17, 10.0),
        _row("baseline", 0, 20.0),
        _row("forced", 12, 12.5),
    ]
    (cell,) = job_split_summary(rows)
    assert cell["best_split"] == 17 and cell["best_job_s"] == 10.0
    assert cell["auto_over_best"] == pytest.approx(1.1)
    assert cell["freeze_over_best"] == 1.0 and cell["baseline_over_best"] == 2.0
    assert cell["auto_decided_s"] == 0.4 and cell["splits_measured"] == 4
    assert cell["auto_aside_over_best"] == pytest.approx(1.06)  # (11.0 - 0.4) / 10.0
    assert "folder-12k" in format_job_split([cell])


def test_each_rule_is_judged_by_the_least_of_its_rounds_and_the_spread_is_reported() -> None:
    rows = [
        _row("auto", 14, 13.0, decided=2.5),  # a round with a cold decision and head
        _row("freeze", 17, 10.5),
        _row("baseline", 0, 20.0),
        _row("auto", 14, 10.4, decided=0.6),
        _row("freeze", 17, 10.0),
        _row("baseline", 0, 21.0),
    ]
    (cell,) = job_split_summary(rows)
    assert cell["best_split"] == 17 and cell["best_job_s"] == 10.0
    assert cell["auto_job_s"] == 10.4 and cell["auto_over_best"] == pytest.approx(1.04)
    assert cell["auto_decided_s"] == 0.6 and cell["auto_decided_max_s"] == 2.5
    assert cell["noise"] == pytest.approx(1.25)  # auto's 13.0 over its 10.4
    assert "1.25" in format_job_split([cell])


def test_the_warm_up_round_is_not_judged_but_its_cold_decision_is_reported() -> None:
    warm_up = [
        {**_row("auto", 14, 13.0, decided=2.5), "warmup": True},
        {**_row("freeze", 17, 9.0), "warmup": True},  # faster, but not judged
    ]
    rows = [*warm_up, _row("auto", 14, 10.4, decided=0.6), _row("freeze", 17, 10.0)]
    (cell,) = job_split_summary(rows)
    assert cell["best_job_s"] == 10.0 and cell["auto_over_best"] == pytest.approx(1.04)
    assert cell["noise"] == 1.0  # one judged round each
    assert cell["auto_decided_s"] == 0.6 and cell["auto_decided_max_s"] == 2.5


def test_the_scenario_is_registered_for_make_bench() -> None:
    assert "jobsplit" in ORDER and SCENARIOS["jobsplit"].testbed


def test_the_report_gives_each_cell_and_how_many_meet_the_goal(tmp_path: Path) -> None:
    results = ResultSet.start(
        "jobsplit",
        testbed={"cores_note": "client on core(s) 0", "link_method": "tc htb on a veth pair"},
        quick=True,
        epochs=3,
        batch_size=32,
        repeats=2,
        datasets={
            "folder-12k": {
                "num_samples": 300,
                "layout": "folder",
                "stored_bytes_per_sample": 12_300.0,
            }
        },
        link_checks=[{"target_mbit": 50.0, "measured_mbit": 48.2}],
        load_average_start=[1.5, 1.0, 1.0],
    )
    for row in (
        _row("auto", 17, 10.4, decided=0.6),
        _row("auto", 17, 13.0, decided=2.5),
        _row("freeze", 17, 10.0),
        _row("baseline", 0, 20.0),
    ):
        results.add(row)
    results.write(tmp_path)
    text = write_report(tmp_path, tmp_path / "results.md").read_text()
    section = text[text.index("## The split decision on the whole job") :]
    assert "`hapi bench jobsplit --quick` (client on core(s) 0; link by tc htb" in section
    assert "50 Mbit/s (measured 48)" in section and "`folder-12k`: 300 samples" in section
    assert (
        "| folder-12k | alexnet | 50 | 17 | 10.00 | 17 | 1.04 | 0.98 | 1 | 2 | 1.04 "
        "| 0.60 (longest 2.50) | 1.25 |" in section
    )
    assert "within 1.10x of the best measured job in **1 of 1** cells" in section
    assert "More than 10% slower than the freeze index in 0 of 1." in section
    assert "More than 10% slower than BASELINE in 0 of 1." in section
    assert "In 1 cell(s) the runs' own noise is above 1.10" in section


class _FakeCell(_Cell):
    """The cell's round logic over fixed job times per split (no stack)."""

    def __init__(self, jobs: dict[object, float]) -> None:
        self.measured = {}
        self.jobs = jobs
        self.calls: list[tuple[object, int]] = []

    def run(self, split: Any, rule: str, repeat: int = -1) -> Any:
        self.calls.append((split, repeat))
        index = {"auto": 14, "freeze": 17}.get(split, split)
        job = self.jobs[index]
        self.measured[index] = min(self.measured.get(index, job), job)
        predictions = [
            SimpleNamespace(split=i, job_s=lambda _j, i=i: abs(i - 14)) for i in range(18)
        ]
        decision = SimpleNamespace(split_index=14, job=object(), predictions=predictions)
        return SimpleNamespace(
            split=decision, split_seconds=0.0, history=[SimpleNamespace(seconds=job)]
        )


def test_a_cell_warms_auto_and_its_neighbours_and_stops_repeating_far_slower_runs() -> None:
    slow = PRUNE_OVER_BEST * 10.0 + 1.0
    # Auto is far slower too (its decision, say), but the rules judged run every round.
    cell = _FakeCell({14: slow, 17: 10.0, 0: 30.0, 13: 11.0, 15: slow})
    cell.measure(extra=2, repeats=3)
    warm_up = [split for split, repeat in cell.calls if repeat < 0]
    assert warm_up == ["auto", 13, 15]  # nearest auto's predicted job; no freeze, no BASELINE
    rounds = {r: [s for s, rep in cell.calls if rep == r] for r in range(3)}
    assert rounds[0] == ["auto", "freeze", 0, 13, 15]
    # BASELINE (3x) and split 15 (over PRUNE_OVER_BEST x) are judged once; auto every round.
    assert rounds[1] == rounds[2] == ["auto", "freeze", 13]
