"""Start-up cost: wall time and peak RSS of ``hapi --help``, ``import hapi_client``, ``import torch``.

Each command runs in a fresh interpreter, three times (median reported); the peak RSS is the
child's own ``ru_maxrss`` (``wait4`` in a small launcher, so that this process's size does not
count). ``import torch`` is the floor the other two are compared against. A benchmark, not a
test: it asserts nothing::

    python -m hapi_bench.startup [--runs 3] [--out startup.json]
    hapi bench startup                      # the same, as a scenario: bench-results/startup.{json,csv}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .results import ResultSet

__all__ = ["Measurement", "commands", "main", "measure", "run_startup"]

RUNS = 3


@dataclass(frozen=True)
class Measurement:
    """One command's runs: wall seconds and peak RSS in MiB per run, and the exit codes."""

    name: str
    argv: list[str]
    wall_s: list[float]
    peak_rss_mib: list[float]
    exit_codes: list[int]

    def row(self) -> dict[str, Any]:
        return {
            "command": self.name,
            "runs": len(self.wall_s),
            "wall_s": round(statistics.median(self.wall_s), 3),
            "peak_rss_mib": round(statistics.median(self.peak_rss_mib), 1),
            "ok": all(code == 0 for code in self.exit_codes),
            "wall_s_all": [round(t, 3) for t in self.wall_s],
            "peak_rss_mib_all": [round(m, 1) for m in self.peak_rss_mib],
            "argv": self.argv,
        }


def commands() -> dict[str, list[str]]:
    """The measured commands, by name; ``hapi`` is the installed console script when there is one."""
    python = sys.executable
    script = Path(python).with_name("hapi")
    # The console script is what a user runs; `-m` is the same code path minus the script's shim.
    hapi = [str(script)] if script.is_file() else [python, "-m", "hapi_cli.main"]
    return {
        "hapi --help": [*hapi, "--help"],
        "import hapi_client": [python, "-c", "import hapi_client"],
        "import torch": [python, "-c", "import torch"],
    }


# Runs one command and prints [wall seconds, ru_maxrss, exit code]. A fresh, small interpreter
# starts each command because Linux counts the spawning process's peak RSS into the child's
# ru_maxrss (the address space it forks or vforks from is the child's until exec): spawned from
# this process, or from pytest, every command would weigh at least what its parent weighs.
_LAUNCHER = """
import json, os, sys, time
null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
started = time.perf_counter()
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=null)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - started
print(json.dumps([wall, usage.ru_maxrss, os.waitstatus_to_exitcode(status)]))
"""


def _rss_mib(maxrss: int) -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 2**10


def _run_once(argv: list[str]) -> tuple[float, float, int]:
    out = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, *argv], capture_output=True, text=True, check=True
    )
    wall, maxrss, code = json.loads(out.stdout)
    return float(wall), _rss_mib(int(maxrss)), int(code)


def measure(runs: int = RUNS, which: dict[str, list[str]] | None = None) -> list[Measurement]:
    """Run every command ``runs`` times, round-robin so that a load spike hits all of them alike."""
    which = commands() if which is None else which
    samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in which}
    for _ in range(runs):
        for name, argv in which.items():
            samples[name].append(_run_once(argv))
    return [
        Measurement(
            name,
            argv,
            [s[0] for s in samples[name]],
            [s[1] for s in samples[name]],
            [s[2] for s in samples[name]],
        )
        for name, argv in which.items()
    ]


def format_table(results: list[Measurement]) -> str:
    lines = [f"{'command':<20} {'wall s (median)':>16} {'peak RSS MiB':>13}  runs (s)"]
    for m in results:
        row = m.row()
        failed = "" if row["ok"] else f"  FAILED (exit {m.exit_codes})"
        runs = ", ".join(f"{t:.2f}" for t in row["wall_s_all"])
        lines.append(
            f"{m.name:<20} {row['wall_s']:>16.2f} {row['peak_rss_mib']:>13.0f}  {runs}{failed}"
        )
    return "\n".join(lines)


def _result_set(results: list[Measurement], runs: int) -> ResultSet:
    # Built after the runs: machine_info() imports torch, which would warm the page cache for them.
    results_set = ResultSet.start("startup", runs=runs, statistic="median")
    for m in results:
        results_set.add(m.row())
    return results_set


def run_startup(out_dir: str, quick: bool = True) -> int:
    """The ``startup`` scenario: measure, print the table, write ``startup.json`` and ``.csv``.

    ``quick`` changes nothing: three runs of each command take well under a minute.
    """
    del quick
    results = measure(RUNS)
    print(format_table(results), flush=True)
    paths = _result_set(results, RUNS).write(Path(out_dir))
    print(f"[startup] wrote {', '.join(str(p) for p in paths)}", flush=True)
    return 0 if all(m.row()["ok"] for m in results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per command (median)")
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    results = measure(max(1, args.runs))
    print(format_table(results))
    if args.out is not None:
        results_set = _result_set(results, args.runs)
        # The same layout as the scenario's startup.json, at the path asked for.
        results_set.meta["load_average_end"] = os.getloadavg()
        payload = {"meta": results_set.meta, "rows": results_set.rows}
        args.out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0 if all(m.row()["ok"] for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())
