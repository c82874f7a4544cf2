"""``hapi demo``: HAPI vs BASELINE fine-tuning where the network is the bottleneck (``make demo``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hapi_stack import PortInUseError, StackConfig, StackError, up

from .choices import DEMO_DEFAULTS
from .link_options import add_link_options, shaping_of, shaping_reason

__all__ = ["ERRORS", "register"]

# hapi_bench's errors count as user errors by their package (see main); importing them here would
# load torch for every `hapi --help`.
ERRORS: tuple[type[BaseException], ...] = (StackError,)


def _keep(state_dir: Path) -> None:
    # The demo's own stack ran in a private namespace (or was stopped with it): bring the same
    # state directory up on loopback so its data can be used with `hapi finetune`.
    try:
        stack = up(StackConfig(state_dir=state_dir, hapi_server=True))
    except PortInUseError:
        stack = up(StackConfig.on_free_ports(state_dir=state_dir, hapi_server=True))
    print(
        f"--keep: the demo's stack runs on loopback: HAPI {stack.hapi_url}, Swift auth {stack.auth_url} "
        f"(test:tester / testing); stop it with `hapi stack down --state-dir {state_dir}`"
    )


def _run(args: argparse.Namespace) -> int:
    from hapi_bench import run_job

    started = time.perf_counter()
    reason = shaping_reason(args)
    how = (
        "tc (htb) in private network namespaces"
        if reason is None
        else f"a client-side token bucket ({reason})"
    )
    print(f"hapi demo: the link will be limited with {how}", flush=True)
    config = {
        "rate_mbit": args.rate,
        "train_per_class": args.train_per_class,
        "test_per_class": args.test_per_class,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "freeze_index": args.freeze_index,
        "prefetch": args.prefetch,
    }
    args.state_dir.mkdir(parents=True, exist_ok=True)
    results = args.state_dir / "demo-results.json"
    code = run_job(
        "hapi_bench.demo:demo_job",
        {"config": config, "results_path": str(results.resolve())},
        args.state_dir,
        shaping=shaping_of(args),
        nice=args.nice,
    )
    if args.keep:
        _keep(args.state_dir)
    print(
        f"hapi demo: {'done' if code == 0 else 'HAPI did not beat BASELINE'} in "
        f"{time.perf_counter() - started:.0f} s; results in {results}"
    )
    return code


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to the ``hapi`` parser."""
    p = subparsers.add_parser(
        "demo",
        help="fine-tune EfficientNet-Lite0 through HAPI and BASELINE where the network is the "
        "bottleneck",
        description="Start Swift + the HAPI server, upload ImageNet-sized photos and the EfficientNet-Lite0 "
        "weights (reused on later runs), limit the client's link (tc in private network namespaces when "
        "root, else a client-side token bucket) to a rate in the network-bound regime measured on this "
        "machine (or --rate), fine-tune through HAPI (split chosen by predicted time) and "
        "as BASELINE, evaluate on held-out photos and print a comparison table.",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".hapi/demo"),
        help="where the demo's Swift keeps its data (default: %(default)s)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=DEMO_DEFAULTS["rate_mbit"],
        help="link rate in Mbit/s (default: a third of the rate where BASELINE's link keeps "
        "up with its compute on this machine, measured first: the network-bound regime)",
    )
    p.add_argument(
        "--train-per-class",
        type=int,
        default=DEMO_DEFAULTS["train_per_class"],
        help="training photos per class, 10 classes (default: %(default)s)",
    )
    p.add_argument(
        "--test-per-class",
        type=int,
        default=DEMO_DEFAULTS["test_per_class"],
        help="held-out photos per class (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=DEMO_DEFAULTS["batch_size"],
        help="training batch size of both runs (default: %(default)s)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=DEMO_DEFAULTS["epochs"],
        help="epochs of each run (default: %(default)s)",
    )
    p.add_argument(
        "--freeze-index",
        type=int,
        default=DEMO_DEFAULTS["freeze_index"],
        help="layers before it stay frozen (default: %(default)s, the last two stages and the head train)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=DEMO_DEFAULTS["prefetch"],
        help="shards in flight in both runs (default: %(default)s)",
    )
    add_link_options(p, "demo")
    p.add_argument(
        "--keep", action="store_true", help="leave the stack running afterwards (on loopback)"
    )
    p.set_defaults(func=_run)
