"""The ``jobsplit`` scenario's summary: each rule's job time over the best split's (no stack)."""

from __future__ import annotations

import pytest
from hapi_bench import ORDER
from hapi_bench.scenario_job_split import format_job_split, job_split_summary
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
    assert "folder-12k" in format_job_split([cell])


def test_each_rule_is_judged_by_the_least_of_its_rounds_and_the_spread_is_reported() -> None:
    rows = [
        _row("auto", 14, 13.0, decided=2.5),  # the first round: a cold decision and head
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


def test_the_scenario_is_registered_for_make_bench() -> None:
    assert "jobsplit" in ORDER and SCENARIOS["jobsplit"].testbed
