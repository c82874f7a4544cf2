"""Unit tests of the benchmark harness's pure parts: verdicts, bounds, sampling, files, report."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hapi_bench import (
    LinkCheck,
    ResultSet,
    Sample,
    Sampler,
    ThrottleLink,
    format_demo_table,
    lower_bound,
    split_cores,
    write_report,
)
from hapi_bench.report import headline, markdown_table
from hapi_bench.scenario_e2e import RATES_MBIT, e2e_grid


def check(target: float | None, measured: float) -> LinkCheck:
    return LinkCheck("netns", "htb", target, measured, 1000, 1.0)


def test_a_rate_more_than_ten_percent_off_is_flagged() -> None:
    assert not check(100.0, 95.5).flagged
    assert not check(100.0, 90.5).flagged
    assert check(100.0, 89.0).flagged
    assert check(100.0, 111.0).flagged
    assert not check(None, 5000.0).flagged  # unshaped: nothing to compare with
    assert check(100.0, 80.0).as_dict()["off_by"] == pytest.approx(-0.2)
    assert "FLAGGED" in check(100.0, 80.0).describe()


def test_lower_bound_is_the_largest_part() -> None:
    bound = lower_bound(
        storage_cpu_s=2.0, client_cpu_s=3.0, nbytes=50_000_000, rate_bytes_per_s=12_500_000
    )
    assert bound.network_s == pytest.approx(4.0)
    assert bound.seconds == pytest.approx(4.0)
    assert bound.limiter == "network"
    assert lower_bound(5.0, 1.0, 0, 1.0).limiter == "server"


def test_a_sequential_bound_adds_the_server_and_the_transfer() -> None:
    """ALL_IN_COS trains on the server and then returns the model: nothing overlaps."""
    bound = lower_bound(2.0, 3.0, 50_000_000, 12_500_000, sequential=True)
    assert bound.seconds == pytest.approx(6.0)
    assert bound.limiter == "server, then network"
    assert lower_bound(1.0, 9.0, 12_500_000, 12_500_000, sequential=True).limiter == "client"


class _NoLink(ThrottleLink):
    pass


def test_sampler_interpolates_between_samples() -> None:
    sampler = Sampler([], None, _NoLink())
    sampler.samples = [Sample(0.0, 0.0, 0.0, 0.0, 0, 0), Sample(1.0, 1.0, 2.0, 0.5, 100, 10)]
    mid = sampler.at(0.5)
    assert (mid.client_cpu, mid.storage_cpu, mid.rx) == (0.5, 1.0, 50)
    span = sampler.between(0.25, 0.75)
    assert span.at == pytest.approx(0.5)
    assert span.storage_cpu == pytest.approx(1.0)
    assert sampler.at(5.0) == sampler.samples[-1]  # clamped past the last sample


def test_cores_are_split_without_overlap() -> None:
    split = split_cores({0, 1})
    assert split.client == (0,) and split.server == (1,) and split.disjoint
    assert split_cores({3}).client == split_cores({3}).server == (3,)
    assert not split_cores({3}).disjoint
    assert split_cores({0, 1, 2, 3}).server == (2, 3)


def test_throttle_link_routes_a_clients_reads_through_one_bucket() -> None:
    link = ThrottleLink()
    link.set_rate(100.0)
    assert link.rate_mbit == 100.0
    link.bucket.consume(10)
    link.set_rate(None)
    link.bucket.consume(5)
    assert link.counters() == (15, 0)


def test_results_write_json_and_csv_with_the_machine(tmp_path: Path) -> None:
    results = ResultSet.start("demo-x", testbed={"link": "netns", "cores_note": "client on 0"})
    results.add({"model": "alexnet", "epoch_s": 1.5, "nested": {"a": 1}})
    results.add({"model": "resnet18", "epoch_s": 2.5, "extra": 3})
    json_path, csv_path = results.write(tmp_path)
    data = json.loads(json_path.read_text())
    assert data["meta"]["machine"]["cores"] >= 1 and data["meta"]["machine"]["versions"]["torch"]
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["model"] for r in rows] == ["alexnet", "resnet18"]
    assert rows[0]["link"] == "netns" and rows[0]["torch"] and rows[0]["machine"]
    assert "nested" not in rows[0] and rows[1]["extra"] == "3"


def test_quick_grid_trims_but_keeps_the_headline_runs() -> None:
    quick, full = e2e_grid(True), e2e_grid(False)
    assert set(quick.runs) < set(full.runs)
    for rate in RATES_MBIT:
        for mode in ("baseline", "hapi"):
            assert (rate, "alexnet", mode) in quick.runs
    assert (100.0, "alexnet", "all_in_cos") in quick.runs  # the headline rate keeps every mode
    assert {m for _, m, _ in quick.runs} == {"alexnet", "resnet18", "efficientnet_lite0"}
    assert "quick" in quick.note


def _e2e_row(mode: str, epoch: float, per_iter: float) -> dict[str, object]:
    return {
        "model": "alexnet",
        "mode": mode,
        "rate_target_mbit": 100.0,
        "rate_measured_mbit": 95.0,
        "rate_flagged": False,
        "split_index": 13 if mode == "hapi" else 0,
        "epoch_s": epoch,
        "bytes_per_iteration": per_iter,
        "lower_bound_s": epoch / 2,
        "bound_limiter": "client",
        "bound_ratio": 2.0,
    }


def test_report_puts_our_numbers_beside_the_thesis(tmp_path: Path) -> None:
    results_dir = tmp_path / "results"
    e2e = ResultSet.start(
        "e2e",
        testbed={
            "link": "netns",
            "cores": {"client": [0]},
            "cores_note": "x",
            "link_method": "htb",
        },
        grid="g",
        batch_size=64,
        dataset={"source": "photos", "stored_bytes_per_sample": 115000.0},
    )
    e2e.add(_e2e_row("hapi", 2.0, 2_400_000.0))
    e2e.add(_e2e_row("baseline", 3.0, 7_200_000.0))
    e2e.write(results_dir)
    (results_dir / "e2e.png").write_bytes(b"png")
    top = headline(e2e)
    assert (
        top is not None
        and top["bytes_ratio"] == pytest.approx(3.0)
        and top["time_ratio"] == pytest.approx(1.5)
    )
    out = write_report(results_dir, tmp_path / "docs" / "results.md")
    text = out.read_text()
    assert "3.00x the bytes per iteration" in text and "1.50x HAPI's" in text
    assert "2.8x at 50 Mbit/s" in text  # the thesis' number for the same experiment
    assert "(img/e2e.png)" in text and (tmp_path / "docs" / "img" / "e2e.png").is_file()


def test_markdown_and_demo_tables() -> None:
    table = markdown_table(("a", "b"), [(1, None), (2.5, "x")])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | – |", "| 2.5 | x |"]
    row = {
        **_e2e_row("hapi", 2.0, 2_400_000.0),
        "freeze_index": 18,
        "eval_accuracy": 0.9,
        "samples_per_s": 10.0,
    }
    text = format_demo_table([row, {**row, "mode": "baseline", "eval_accuracy": None}])
    assert "HAPI" in text and "13 (freeze 18)" in text and "0.900" in text and "BASELINE" in text


def test_the_load_note_blames_other_work_only_for_load_before_the_first_run() -> None:
    from hapi_bench.report import _load_note

    def run(started: str, start: float, end: float) -> ResultSet:
        return ResultSet(
            "x", {"started": started, "load_average_start": [start], "load_average_end": [end]}, []
        )

    ours = [run("2026-01-01T00:00", 0.6, 1.2), run("2026-01-01T00:10", 1.2, 6.1)]
    loads = [0.6, 1.2, 1.2, 6.1]
    [own] = [line for line in _load_note(ours, loads, 2) if line]
    assert own.startswith("**Load**") and "0.6" in own and "6.1" in own
    busy = [run("2026-01-01T00:00", 4.0, 4.5), *ours[1:]]
    [other] = [line for line in _load_note(busy, [4.0, 4.5, 1.2, 6.1], 2) if line]
    assert other.startswith("**Note**: other work") and "4.0" in other


def test_report_has_a_startup_section(tmp_path: Path) -> None:
    results_dir = tmp_path / "results"
    startup = ResultSet.start("startup", statistic="median")
    startup.add({"command": "hapi --help", "runs": 3, "wall_s": 0.5, "peak_rss_mib": 47.0})
    startup.write(results_dir)
    text = write_report(results_dir, tmp_path / "results.md").read_text()
    assert "## Start-up" in text and "| `hapi --help` | 0.5 | 47 | 3 |" in text


class _StubSampler:
    def __init__(self, *args: object) -> None:
        pass

    def __enter__(self) -> _StubSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _stub_testbed() -> object:
    from types import SimpleNamespace

    return SimpleNamespace(stack=SimpleNamespace(pids={}, server_pid=None), link=None)


def test_run_concurrently_starts_the_runs_together_and_keeps_each_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep's and the tenants' rounds: every run passes one barrier, then each row and end
    time lands at its own index."""
    import hapi_bench.runs as runs

    def fake(testbed: object, spec: str, link: object, **kw: object) -> tuple[None, dict[str, str]]:
        barrier = kw["barrier"]
        barrier.wait()  # type: ignore[attr-defined]
        return None, {"spec": spec}

    monkeypatch.setattr(runs, "Sampler", _StubSampler)
    monkeypatch.setattr(runs, "measured_finetune", fake)
    done = runs.run_concurrently(_stub_testbed(), ["a", "b", "c"], None, "t")  # type: ignore[arg-type]
    assert [r["spec"] for r in done.rows] == ["a", "b", "c"]
    assert all(w >= 0 for w in done.walls) and len(done.walls) == 3


def test_run_concurrently_raises_the_first_failure_once_all_have_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    import hapi_bench.runs as runs

    stopped: list[str] = []
    lock = threading.Lock()

    def fake(testbed: object, spec: str, link: object, **kw: object) -> tuple[None, dict[str, str]]:
        try:
            if spec == "bad":
                raise RuntimeError("the bad run")
            kw["barrier"].wait()  # type: ignore[attr-defined]  # broken by the failure
            return None, {}
        finally:
            with lock:
                stopped.append(spec)

    monkeypatch.setattr(runs, "Sampler", _StubSampler)
    monkeypatch.setattr(runs, "measured_finetune", fake)
    with pytest.raises(RuntimeError, match="the bad run"):
        runs.run_concurrently(_stub_testbed(), ["ok", "bad"], None, "t")  # type: ignore[arg-type]
    assert sorted(stopped) == ["bad", "ok"]
