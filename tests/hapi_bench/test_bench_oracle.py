"""The oracle scenario's summary and the network-bound regime's arithmetic (no stack)."""

from __future__ import annotations

import pytest
from hapi_bench.regime import Regime
from hapi_bench.scenario_oracle import format_oracle, oracle_summary


def _row(model: str, rate: float, rule: str, split: int, epoch: float) -> dict[str, object]:
    return {
        "model": model,
        "rate_target_mbit": rate,
        "rule": rule,
        "split_index": split,
        "epoch_s": epoch,
    }


def test_summary_compares_each_rule_with_the_best_split() -> None:
    rows = [
        _row("alexnet", 10.0, "auto", 8, 11.0),
        _row("alexnet", 10.0, "thesis", 16, 13.2),
        _row("alexnet", 10.0, "forced", 9, 10.0),
        _row("alexnet", 10.0, "forced", 13, 12.0),
        _row("alexnet", 50.0, "auto", 3, 5.0),
        _row("alexnet", 50.0, "thesis", 3, 5.5),
    ]
    by_rate = {e["rate_mbit"]: e for e in oracle_summary(rows)}
    slow = by_rate[10.0]
    assert slow["best_split"] == 9 and slow["best_epoch_s"] == 10.0
    assert slow["auto_over_best"] == pytest.approx(1.1)
    assert slow["thesis_over_best"] == pytest.approx(1.32)
    assert slow["splits_measured"] == 4
    fast = by_rate[50.0]
    # The same split run twice: judged by its faster epoch, whichever rule chose it; the
    # spread between the two is the point's noise.
    assert fast["best_split"] == 3 and fast["auto_over_best"] == 1.0
    assert fast["thesis_over_best"] == 1.0 and fast["thesis_epoch_s"] == 5.0
    assert fast["noise"] == pytest.approx(1.1) and slow["noise"] == 1.0
    assert "alexnet" in format_oracle(list(by_rate.values()))


def test_confirming_epochs_judge_each_split_by_its_least() -> None:
    """A lucky single epoch of another split (9: 10.0 s) is measured again: its least is
    compared with auto's split's least, and the spread is reported."""
    rows = [
        _row("alexnet", 10.0, "auto", 8, 11.0),
        _row("alexnet", 10.0, "thesis", 16, 13.2),
        _row("alexnet", 10.0, "forced", 9, 10.0),
        _row("alexnet", 10.0, "confirm", 8, 10.3),
        _row("alexnet", 10.0, "confirm", 9, 10.8),
        _row("alexnet", 10.0, "confirm", 8, 10.6),
        _row("alexnet", 10.0, "confirm", 9, 11.0),
    ]
    (point,) = oracle_summary(rows)
    assert point["best_split"] == 9 and point["best_epoch_s"] == 10.0
    assert point["auto_epoch_s"] == 10.3 and point["auto_over_best"] == pytest.approx(1.03)
    assert point["noise"] == pytest.approx(1.1)  # split 9's 11.0 over its 10.0
    assert point["splits_measured"] == 3


def test_crossover_is_where_link_time_equals_compute() -> None:
    regime = Regime("alexnet", 17, 50, 110_000.0, 0.01, 0.03, 0.01)
    assert regime.compute_s == pytest.approx(0.05)
    # 110 kB per image in 50 ms: 2.2 MB/s = 17.6 Mbit/s.
    assert regime.crossover_mbit == pytest.approx(17.6)
    link_s = regime.stored_bytes_per_sample * 8 / (regime.crossover_mbit * 1e6)
    assert link_s == pytest.approx(regime.compute_s)
    assert "17.6 Mbit/s" in regime.describe()
