"""Time every aggregation rule of ``hapi_client.robust`` beside ByzFL's (Garfield's GAR micro-benchmark).

For n in {7, 11, 15, 17} inputs, f = the largest f each rule accepts for that n, and d in
{1e5, 1e6} coordinates, time ``rule(list_of_n_tensors)`` (stacking the list included, as a
server receives separate tensors) and, on the same list, ByzFL 0.0.11's counterpart where it
has one; print both medians and the ratio ours / ByzFL; results go to ``--out`` as JSON.
Garfield ran the same kind of sweep on GPUs with f = floor((n-3)/4) for every rule
(thesis §3.6.3; Garfield paper §6.3, see docs/references.md); here each rule gets its own maximum f, so Bulyan and Krum are
timed at the f that stresses them most.

ByzFL counterparts (see ``hapi_client.robust.aggregators`` for the definitions that differ):
``Average``, ``Median``, ``TrMean(f)``, ``Krum(f + 1)`` and ``MultiKrum(f + 1)`` (the same
neighbour count as ours), ``MDA(f)``, ``NNM(f)``, ``Bucketing(2)``, ``Clipping(2.0)``. ByzFL has
no Bulyan and no batch-weighted average. A ByzFL call that raises is reported as such (its
median is ``torch.quantile``, which refuses inputs above 2^24 elements).

    python benchmarks/gars.py                 # full sweep (several minutes on 2 CPU cores)
    python benchmarks/gars.py --quick         # n in {7, 11}, d in {1e4, 1e5}, 2 repeats
    python benchmarks/gars.py --n 17 --d 1000000   # one cell
    python benchmarks/gars.py --device cuda   # on a GPU (synchronised before each clock read)
    python benchmarks/gars.py --no-byzfl      # ours only
    python benchmarks/gars.py --threads 1     # one CPU thread for both (steadier on a busy host)
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
    return time_pair(fn, None, device, repeats)[0]


def time_pair(
    ours: Callable[[], object],
    theirs: Callable[[], object] | None,
    device: torch.device,
    repeats: int,
) -> tuple[list[float], list[float]]:
    """Milliseconds of ``repeats`` calls of each, alternated after one warm-up call of each.

    Alternating puts both under the same background load (the ratio stays meaningful on a
    shared machine, where two separate series would each see a different load).
    """
    fns = [ours] if theirs is None else [ours, theirs]
    for fn in fns:
        fn()
    _sync(device)
    samples: list[list[float]] = [[] for _ in fns]
    for i in range(repeats):
        # Swap who goes first every repeat: the second call finds the first one's freed memory.
        order = list(zip(fns, samples, strict=True))
        for fn, out in order if i % 2 == 0 else order[::-1]:
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            out.append((time.perf_counter() - start) * 1000.0)
    return samples[0], samples[1] if theirs is not None else []


def byzfl_counterpart(label: str, f: int) -> Callable[[list[torch.Tensor]], object] | None:
    """ByzFL's rule or step for our ``label`` at ``f`` (None: ByzFL has none, or is not installed)."""
    try:
        import byzfl
    except ImportError:
        return None
    factories: dict[str, Callable[[], Callable[[list[torch.Tensor]], object]]] = {
        "average": lambda: byzfl.Average(),
        "median": lambda: byzfl.Median(),
        "trimmed_mean": lambda: byzfl.TrMean(f=f),
        # ByzFL averages over n - f - 1 neighbours: f + 1 there is our f's neighbour count.
        "krum": lambda: byzfl.Krum(f=f + 1),
        "multi_krum": lambda: byzfl.MultiKrum(f=f + 1),
        "mda": lambda: byzfl.MDA(f=f),
        "pre:nnm": lambda: byzfl.NNM(f=f),
        "pre:bucketing": lambda: byzfl.Bucketing(s=2),
        "pre:clipping": lambda: byzfl.Clipping(c=2.0),
    }
    factory = factories.get(label)
    return factory() if factory is not None else None


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "mean_ms": statistics.fmean(samples),
        "median_ms": statistics.median(samples),
        "min_ms": min(samples),
        "std_ms": statistics.stdev(samples) if len(samples) > 1 else 0.0,
    }


def run(
    ns: list[int],
    ds: list[int],
    rules: list[str],
    pre_steps: list[str],
    device: torch.device,
    repeats: int,
    seed: int,
    with_byzfl: bool = True,
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
                theirs = byzfl_counterpart(label, f) if with_byzfl else None
                error: str | None = None
                if theirs is not None:
                    try:
                        # ByzFL stacks the list into a new tensor first, so Clipping's in-place
                        # writes never reach ``inputs``.
                        theirs(inputs)
                    except (RuntimeError, ValueError) as exc:
                        error, theirs = f"{type(exc).__name__}: {exc}"[:200], None
                bound = None if theirs is None else functools.partial(theirs, inputs)
                mine, other = time_pair(fn, bound, device, repeats)
                row: dict[str, object] = {
                    "rule": label,
                    "n": n,
                    "f": f,
                    "d": d,
                    "device": str(device),
                    "repeats": repeats,
                    **_summary(mine),
                    "byzfl_median_ms": statistics.median(other) if other else None,
                    "ratio": statistics.median(mine) / statistics.median(other) if other else None,
                    "byzfl_error": error,
                }
                results.append(row)
                print(f"{label:18s} n={n:3d} f={f:2d} d={d:>9,d}  {_cells(row)}", flush=True)
    return results


def _cells(row: dict[str, object]) -> str:
    ours = f"ours {float(str(row['median_ms'])):9.2f} ms"
    if row["byzfl_median_ms"] is not None:
        return (
            f"{ours}  byzfl {float(str(row['byzfl_median_ms'])):9.2f} ms"
            f"  ratio {float(str(row['ratio'])):5.2f}"
        )
    if row["byzfl_error"] is not None:
        return f"{ours}  byzfl raised ({str(row['byzfl_error']).split(':')[0]})"
    return f"{ours}  byzfl -"


def print_table(results: list[dict[str, object]]) -> None:
    """One row per (rule, d, n): our median, ByzFL's median and the ratio ours / ByzFL."""
    header = (
        f"{'rule':18s}{'n':>4s}{'f':>4s}{'d':>10s}"
        f"{'ours ms':>12s}{'byzfl ms':>12s}{'ours/byzfl':>12s}"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in sorted(results, key=lambda r: (str(r["rule"]), int(str(r["d"])), int(str(r["n"])))):
        if r["byzfl_median_ms"] is not None:
            theirs = f"{float(str(r['byzfl_median_ms'])):12.2f}"
            ratio = f"{float(str(r['ratio'])):12.2f}"
        else:
            theirs = f"{'raised' if r['byzfl_error'] else '-':>12s}"
            ratio = f"{'-':>12s}"
        print(
            f"{str(r['rule']):18s}{int(str(r['n'])):4d}{int(str(r['f'])):4d}"
            f"{int(str(r['d'])):10.0e}{float(str(r['median_ms'])):12.2f}{theirs}{ratio}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="small sweep for smoke testing")
    parser.add_argument("--out", type=Path, default=Path("bench-results/gars.json"))
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda"
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per cell")
    parser.add_argument("--rules", nargs="*", default=None, help="subset of rule names")
    parser.add_argument("--no-pre", action="store_true", help="skip pre-aggregation steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, nargs="*", default=None, help="input counts")
    parser.add_argument("--d", type=int, nargs="*", default=None, help="coordinates per input")
    parser.add_argument("--no-byzfl", action="store_true", help="do not time ByzFL's rules")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads for both libraries (default: torch's); on a host whose cores "
        "are shared, 1 avoids the waits of a multi-threaded op for a descheduled thread",
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    ns = args.n or ([7, 11] if args.quick else [7, 11, 15, 17])
    ds = args.d or ([10_000, 100_000] if args.quick else [100_000, 1_000_000])
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    rules = args.rules if args.rules else list_aggregators()
    pre_steps = [] if args.no_pre else list_preaggregators()
    device = torch.device(args.device)

    results = run(ns, ds, rules, pre_steps, device, repeats, args.seed, not args.no_byzfl)
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
        "ratio": "our median / ByzFL's median on the same inputs (None: no ByzFL counterpart)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
