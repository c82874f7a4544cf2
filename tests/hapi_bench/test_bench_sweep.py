"""``hapi bench sweep``: its registration and its report section (no stack: a made-up run)."""

from __future__ import annotations

from pathlib import Path

from hapi_bench import SCENARIOS, ResultSet, write_report

MB = 1_000_000


def _row(
    store: str, jobs: int, cpu: float, swift_mb: float, wall: float, client_cpu: float | None
) -> dict[str, object]:
    row: dict[str, object] = {
        "store": store,
        "jobs": jobs,
        "server_cpu_s": cpu,
        "storage_cpu_s": cpu + 0.1,
        "wall_s": [wall] * jobs,
        "slowest_wall_s": wall,
        "mean_wall_s": wall,
        "server_compute_s": cpu * 3,
        "swift_read_bytes": int(swift_mb * MB),
        "computations": 2,
        "store_hits": 0,
        "store_coalesced": jobs - 1,
    }
    if client_cpu is not None:  # recorded since the client's share was in question
        row["client_cpu_s"] = client_cpu * jobs
    return row


def _started(**meta: object) -> ResultSet:
    """A made-up run's results: 80 photos in 2 shards, resnet18, a 1000 Mbit/s link."""
    return ResultSet.start(
        "sweep",
        testbed={
            "cores": {"client": [0], "server": [1]},
            "cores_note": "client on core(s) 0, Swift + HAPI server on core(s) 1",
            "link_method": "tc htb on a veth pair",
        },
        quick=True,
        link_check={"target_mbit": 1000.0},
        model="resnet18",
        store_bytes=512 * 2**20,
        dataset={"container": "bench-sweep-8x40", "samples": 80},
        shard_samples=40,
        **meta,
    )


def _write(
    tmp_path: Path, walls_on: tuple[float, float, float], client_cpu: float | None = None
) -> str:
    results = _started(load_average_start=[2.5, 2.0, 1.0])
    for jobs, cpu, wall in ((1, 3.35, 7.9), (2, 6.67, 18.5), (4, 13.65, 46.4)):
        results.add(_row("off", jobs, cpu, 9.13 * jobs, wall, client_cpu))
    for jobs, cpu, wall in zip((1, 2, 4), (3.32, 3.52, 3.74), walls_on, strict=True):
        results.add(_row("on", jobs, cpu, 9.13, wall, client_cpu))
    results.write(tmp_path)
    text = write_report(tmp_path, tmp_path / "results.md").read_text()
    return text[text.index("## One extraction for many jobs: a sweep (issue 32)") :]


def test_the_scenario_runs_on_the_testbed() -> None:
    scenario = SCENARIOS["sweep"]
    assert scenario.testbed and scenario.entry == "hapi_bench.scenario_sweep:run_sweep"


def test_the_report_shows_each_job_count_and_the_goals_ratios(tmp_path: Path) -> None:
    section = _write(tmp_path, (10.0, 10.2, 18.0))
    assert "`hapi bench sweep --quick`: 1, 2 and 4 concurrent fine-tunes of resnet18" in section
    assert "on the same 80 photos (2 shards of 40)" in section and "*store on*: 512 MiB" in section
    assert "link 1000 Mbit/s by tc htb on a veth pair" in section
    assert "| 1 | 3.35 | 3.32 | 9.13 | 9.13 | 7.9 | 10.0 |" in section
    assert "| 4 | 13.65 | 3.74 | 36.52 | 9.13 | 46.4 | 18.0 |" in section
    assert "**1.13x** the server's CPU seconds (goal <= 1.2x; 4.1x without)" in section
    assert "**1.0x** the Swift bytes (goal <= 1.2x; 4.0x without)" in section
    assert (
        "**1.8x** the slowest wall time (goal <= 1.5x when the server is the bound; 5.9x without)"
        in section
    )
    assert "The wall goal is not met here" in section
    # A run without the client's CPU seconds does not guess why.
    assert "did not record the client's CPU seconds" in section
    assert "the client is the bound" not in section
    # One job was slower with the store while the server did the same work: said, with both.
    assert "(10.0 s against 7.9 s)" in section and "(3.32 against 3.35)" in section
    assert "on by default (256 MiB;" in section
    assert "1-minute load average 2.5 when the scenario began and " in section


def test_the_client_cpu_seconds_say_whether_the_client_was_the_bound(tmp_path: Path) -> None:
    # 4 jobs of 4 client CPU seconds each on one client core, 18 s: the client was the bound.
    bound = _write(tmp_path, (10.0, 10.2, 18.0), client_cpu=4.0)
    assert "took 16.00 CPU seconds on the client's single core (one job: 4.00)" in bound
    assert "busy 89% of the slowest job's wall time" in bound
    assert (
        "and the client is the bound: the 4 fine-tunes' training alone (16.00 s on the client's "
        "single core) outlasts one job's whole run (10.0 s)" in bound
    )
    # 1 s each: the client was mostly idle, so it is not blamed; the server's contention is said
    # (stage seconds 3x the CPU seconds in every row of the made-up run).
    idle = _write(tmp_path, (10.0, 10.2, 18.0), client_cpu=1.0)
    assert "busy 22% of the slowest job's wall time" in idle
    assert "the client is the bound" not in idle
    assert "neither side's CPU seconds account for it" in idle
    assert "were 3.0 with one job and 3.0 with 4" in idle


def test_a_met_wall_goal_is_not_explained_away(tmp_path: Path) -> None:
    section = _write(tmp_path, (7.5, 8.0, 10.5))
    assert "**1.4x** the slowest wall time" in section
    assert "not met" not in section
    assert "One job alone" not in section  # one job was not slower with the store


def test_each_split_has_its_own_table_and_goals(tmp_path: Path) -> None:
    results = _started(splits={"freeze": 11, "probe": 13})
    for split, walls in (("freeze", (3.3, 4.9, 7.1)), ("probe", (3.0, 3.2, 3.6))):
        for store in ("off", "on"):
            for jobs, wall in zip((1, 2, 4), walls, strict=True):
                row = _row(store, jobs, 2.8, 9.13, wall if store == "on" else wall * jobs, 1.0)
                results.add({"split": split, **row})
    results.write(tmp_path)
    text = write_report(tmp_path, tmp_path / "results.md").read_text()
    section = text[text.index("## One extraction for many jobs: a sweep (issue 32)") :]
    freeze = section.index("*split 11, the freeze index: each job also trains")
    probe = section.index("*split 13, a linear probe: each job trains the classifier alone")
    assert freeze < probe
    assert "**2.2x** the slowest wall time" in section[freeze:probe]
    assert "**1.2x** the slowest wall time" in section[probe:]
    assert section.count("| 4 | 2.80 | 2.80 |") == 2
    assert section.count("on by default") == 1
