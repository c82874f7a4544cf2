"""Time one batch-adaptation decision: ``hapi_core.solver.solve`` for n queued requests.

The thesis solved eq. 5.1 with a MILP solver (PuLP + CBC) in about 25 ms per decision
(thesis §5.4.5, see docs/references.md); the closed form here should take well under 1 ms. For each n in
{1, 10, 100} and three memory regimes, the benchmark times ``solve`` over seeded random
demands and, as a reference, the same decision as a MILP in ``scipy.optimize.milp`` (HiGHS):

* ``plenty``: every request fits at its b_max (no sharing needed),
* ``share``: all fit at b_min, the rest is water-filled,
* ``tight``: not even b_min for all fits, so requests are deferred and the rest re-planned.

    python benchmarks/solver.py                  # prints a table, writes bench-results/solver.json
    python benchmarks/solver.py --no-milp        # the closed form only
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hapi_core.solver import Demand, solve

MiB = 2**20
REGIMES = ("plenty", "share", "tight")


def demands_for(n: int, seed: int) -> list[Demand]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        b_min = 25
        out.append(
            Demand(
                request_id=f"r{i}",
                bytes_per_sample=rng.randint(200_000, 12 * MiB),  # 64 px heads .. 224 px ResNet
                model_bytes=0,
                b_min=b_min,
                b_max=rng.choice([64, 128, 256, 1000]),
                arrival=float(i),
            )
        )
    return out


def free_for(demands: list[Demand], regime: str) -> int:
    lo = sum(d.footprint(d.b_min) for d in demands)
    hi = sum(d.footprint(d.b_max) for d in demands)
    if regime == "plenty":
        return hi
    if regime == "share":
        return (lo + hi) // 2
    return lo * 2 // 3


def milp_decision(demands: list[Demand], free: int) -> None:
    """The same decision as the thesis' formulation: admission binaries and batch integers."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n = len(demands)
    d = np.array([x.bytes_per_sample for x in demands], dtype=float)
    lo = np.array([x.b_min for x in demands], dtype=float)
    hi = np.array([x.b_max for x in demands], dtype=float)
    # Variables: b_0..b_{n-1}, z_0..z_{n-1} (z_r = 1 if request r runs now).
    c = np.concatenate([-d, np.zeros(n)])
    memory = np.concatenate([d, np.zeros(n)])[np.newaxis, :]
    link_lo = np.hstack([np.eye(n), -np.diag(lo)])  # b_r >= b_min z_r
    link_hi = np.hstack([np.eye(n), -np.diag(hi)])  # b_r <= b_max z_r
    constraints = [
        LinearConstraint(memory, -np.inf, free),
        LinearConstraint(link_lo, 0, np.inf),
        LinearConstraint(link_hi, -np.inf, 0),
    ]
    res = milp(
        c,
        integrality=np.ones(2 * n),
        bounds=Bounds(np.zeros(2 * n), np.concatenate([hi, np.ones(n)])),
        constraints=constraints,
        options={"time_limit": 5.0},
    )
    if res.x is None:
        raise RuntimeError(f"milp failed: {res.message}")


def time_call(fn: Callable[[], object], min_seconds: float, max_calls: int) -> list[float]:
    """Microseconds per call, one sample per call, after one warm-up call."""
    fn()
    samples: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(samples) < max_calls and (len(samples) < 5 or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def summarise(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "calls": len(samples),
        "median_us": statistics.median(ordered),
        "p99_us": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "min_us": ordered[0],
    }


def run(ns: list[int], with_milp: bool, seconds: float, seed: int) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    for n in ns:
        demands = demands_for(n, seed + n)
        for regime in REGIMES:
            free = free_for(demands, regime)
            plan = solve(demands, free)
            row: dict[str, object] = {
                "n": n,
                "regime": regime,
                "admitted": len(plan.batches),
                "deferred": len(plan.deferred),
                "fill": plan.planned_bytes / max(1, free),
                "solve": summarise(
                    time_call(functools.partial(solve, demands, free), seconds, 200_000)
                ),
            }
            if with_milp:
                row["milp"] = summarise(
                    time_call(functools.partial(milp_decision, demands, free), seconds, 200)
                )
            results.append(row)
            line = (
                f"n={n:4d} {regime:7s} admitted {row['admitted']:4d} deferred {row['deferred']:4d} "
                f"solve median {row['solve']['median_us']:9.1f} us"  # type: ignore[index]
            )
            if with_milp:
                line += f"   milp median {row['milp']['median_us'] / 1000:8.2f} ms"  # type: ignore[index]
            print(line, flush=True)
    return results


def print_table(results: list[dict[str, object]], with_milp: bool) -> None:
    header = f"{'n':>5s} {'regime':8s} {'solve median us':>16s} {'solve p99 us':>13s}"
    if with_milp:
        header += f" {'milp median ms':>15s}"
    print()
    print(header)
    print("-" * len(header))
    for r in results:
        s = r["solve"]
        assert isinstance(s, dict)
        line = f"{r['n']:>5} {r['regime']!s:8s} {s['median_us']:16.1f} {s['p99_us']:13.1f}"
        if with_milp:
            m = r["milp"]
            assert isinstance(m, dict)
            line += f" {m['median_us'] / 1000:15.2f}"
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--n", type=int, nargs="*", default=[1, 10, 100])
    parser.add_argument("--no-milp", action="store_true", help="skip the scipy MILP reference")
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/solver.json"))
    args = parser.parse_args(argv)

    results = run(args.n, not args.no_milp, args.seconds, args.seed)
    print_table(results, not args.no_milp)
    meta = {
        "benchmark": "solver",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "demands": "seeded random: 0.2-12 MiB per sample, b_min 25, b_max in {64,128,256,1000}",
        "regimes": {
            "plenty": "free = sum of b_max footprints",
            "share": "free halfway between the b_min and b_max sums",
            "tight": "free = 2/3 of the b_min sum (deferrals)",
        },
        "milp": "scipy.optimize.milp (HiGHS) with admission binaries, the thesis' formulation",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
