"""``hapi bench SCENARIO [--quick]`` and ``hapi bench report``: the thesis' evaluation, reproduced."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

# Only the torch-free modules at the top: the parser is built for every `hapi --help`.
# (BenchError and the other hapi_bench errors count as user errors by their package, see main.)
from hapi_bench.results import DEFAULT_OUT
from hapi_bench.scenarios import ORDER, SCENARIOS

from .link_options import add_link_options, shaping_of, shaping_reason

__all__ = ["REPORT_NAME", "register"]

#: The report's name in the results folder, where `hapi bench report` writes unless told.
REPORT_NAME = "results.md"


def _run(args: argparse.Namespace) -> int:
    from hapi_bench import run_scenarios, write_report

    if args.scenario == "report":
        path = write_report(args.out, args.output or args.out / REPORT_NAME)
        print(f"wrote {path}")
        return 0
    if args.scenario == "list":
        for name in ORDER:
            print(f"{name:11s} {SCENARIOS[name].help}")
        return 0
    started = time.perf_counter()
    reason = shaping_reason(args)
    print(
        f"hapi bench {args.scenario}{' --quick' if args.quick else ''}: results under {args.out}/; link "
        f"{'shaped with tc in private network namespaces' if reason is None else f'throttled by a client-side token bucket ({reason})'}",
        flush=True,
    )
    code = run_scenarios(
        [args.scenario],
        args.out,
        quick=args.quick,
        state_dir=args.state_dir,
        shaping=shaping_of(args),
        nice=args.nice,
    )
    if args.scenario == "all":
        path = write_report(args.out, args.out / REPORT_NAME)
        print(f"wrote {path} (`hapi bench report --output docs/results.md` publishes it)")
    print(
        f"hapi bench {args.scenario}: {'done' if code == 0 else 'some scenarios FAILED'} in "
        f"{time.perf_counter() - started:.0f} s"
    )
    return code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` to the ``hapi`` parser."""
    p = subparsers.add_parser(
        "bench",
        help="bandwidth-limited benchmarks that reproduce the thesis' evaluation",
        description="Run a benchmark scenario against the real stack (Swift + HAPI server on their own cores, "
        "the client's link shaped with tc in private network namespaces when root, else throttled), writing "
        "JSON, CSV and PNG files; `report` turns the JSON into OUT/results.md (or --output, e.g. "
        "docs/results.md, the published copy); `list` names the scenarios.",
    )
    p.add_argument(
        "scenario",
        choices=(*ORDER, "all", "report", "list"),
        metavar="SCENARIO",
        help=f"one of {', '.join(ORDER)}, all, report, list",
    )
    p.add_argument(
        "--quick", action="store_true", help="the trimmed grids of `make bench` (under 20 minutes)"
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="results directory (default: %(default)s)"
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".hapi/bench"),
        help="the benchmark stack's data and logs (default: %(default)s)",
    )
    add_link_options(p, "benchmark")
    p.add_argument(
        "--output",
        "--report-out",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"where `report` writes (default: {REPORT_NAME} in the results directory, --out; "
        "`--output docs/results.md` updates the published copy)",
    )
    p.set_defaults(func=_run)
