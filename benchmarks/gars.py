"""Time every aggregation rule of ``hapi_client.robust`` (Garfield's GAR micro-benchmark).

For n in {7, 11, 15} inputs, f = the largest f each rule accepts for that n, and d in
{1e5, 1e6} coordinates, time ``rule(list_of_n_tensors)`` (stacking the list included, as a
server receives separate tensors) and print a table; results go to ``--out`` as JSON.
Garfield ran the same kind of sweep on GPUs with f = floor((n-3)/4) for every rule
[000:920-927], [003:330-332]; here each rule gets its own maximum f, so Bulyan and Krum are
timed at the f that stresses them most.

    python benchmarks/gars.py                 # full sweep (a few minutes on 2 CPU cores)
    python benchmarks/gars.py --quick         # n in {7, 11}, d in {1e4, 1e5}, 2 repeats
    python benchmarks/gars.py --device cuda   # on a GPU (synchronised before each clock read)
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hapi_client.robust import (
    aggregator_class,
    get_aggregator,
    get_preaggregator,
    list_aggregators,
    list_preaggregators,
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Wall-clock milliseconds of ``repeats`` calls after one warm-up call."""
    fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append((time.perf_counter() - start) * 1000.0)
    return samples


def run(
    ns: list[int],
    ds: list[int],
    rules: list[str],
    pre_steps: list[str],
    device: torch.device,
    repeats: int,
    seed: int,
) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    gen = torch.Generator().manual_seed(seed)
    for d in ds:
        for n in ns:
            inputs = [torch.randn(d, generator=gen).to(device) for _ in range(n)]
            entries: list[tuple[str, int, Callable[[], object]]] = []
            for name in rules:
                f = aggregator_class(name).max_f(n)
                rule = get_aggregator(name, n=n, f=f)
                entries.append((name, f, functools.partial(rule, inputs)))
            for name in pre_steps:
                f = (n - 1) // 2
                step = get_preaggregator(name, n=n, f=f)
                entries.append((f"pre:{name}", f, functools.partial(step, inputs)))
            for label, f, fn in entries:
                samples = time_call(fn, device, repeats)
                row: dict[str, object] = {
                    "rule": label,
                    "n": n,
                    "f": f,
                    "d": d,
                    "device": str(device),
                    "repeats": repeats,
                    "mean_ms": statistics.fmean(samples),
                    "median_ms": statistics.median(samples),
                    "min_ms": min(samples),
                    "std_ms": statistics.stdev(samples) if len(samples) > 1 else 0.0,
                }
                results.append(row)
                print(
                    f"{label:18s} n={n:3d} f={f:2d} d={d:>9,d}  "
                    f"median {row['median_ms']:9.2f} ms  min {row['min_ms']:9.2f} ms",
                    flush=True,
                )
    return results


def print_table(results: list[dict[str, object]]) -> None:
    """One row per rule, one column per (d, n): median milliseconds."""
    columns = sorted({(int(str(r["d"])), int(str(r["n"]))) for r in results})
    labels = list(dict.fromkeys(str(r["rule"]) for r in results))
    cell = {(str(r["rule"]), int(str(r["d"])), int(str(r["n"]))): r for r in results}
    header = f"{'rule (median ms)':18s}" + "".join(f"{f'd={d:.0e} n={n}':>16s}" for d, n in columns)
    print()
    print(header)
    print("-" * len(header))
    for label in labels:
        line = f"{label:18s}"
        for d, n in columns:
            r = cell.get((label, d, n))
            line += f"{float(str(r['median_ms'])):16.2f}" if r else f"{'-':>16s}"
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sweep for smoke testing")
    parser.add_argument("--out", type=Path, default=Path("bench-results/gars.json"))
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda"
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per cell")
    parser.add_argument("--rules", nargs="*", default=None, help="subset of rule names")
    parser.add_argument("--no-pre", action="store_true", help="skip pre-aggregation steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    ns = [7, 11] if args.quick else [7, 11, 15]
    ds = [10_000, 100_000] if args.quick else [100_000, 1_000_000]
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    rules = args.rules if args.rules else list_aggregators()
    pre_steps = [] if args.no_pre else list_preaggregators()
    device = torch.device(args.device)

    results = run(ns, ds, rules, pre_steps, device, repeats, args.seed)
    print_table(results)

    meta = {
        "benchmark": "gars",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "quick": args.quick,
        "input": "list of n float32 tensors of d coordinates (stacking timed)",
        "f": "largest f each rule accepts for n (pre-aggregation steps: (n-1)//2)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
