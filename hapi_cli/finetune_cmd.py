"""``hapi finetune``: fine-tune a model stored in Swift on a dataset container, from the shell."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from hapi_contract import DEFAULT_COMPRESSION, DEFAULT_OUTPUT_DTYPE

from . import workers
from .choices import DEFAULT_AUTH_URL, DEFAULT_ENDPOINT, DEFAULT_RETRY_BUDGET_S, MODES
from .finetune_options import options_from_args
from .tables import format_table

# hapi_client and hapi_models load torch, so _run imports them; their errors (HapiClientError,
# HapiModelError) count as user errors by their package (see main).
__all__ = ["register", "format_table"]


def _split(value: str) -> int | str:
    if value in ("auto", "thesis", "freeze"):
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "--split is 'auto', 'thesis', 'freeze' or a layer index"
        ) from None


class _StatusFormatter(logging.Formatter):
    """``hapi [  12.3 s] message``: the time since the command started, then the step."""

    def format(self, record: logging.LogRecord) -> str:
        return f"hapi [{record.relativeCreated / 1e3:6.1f} s] {record.getMessage()}"


def show_status(quiet: bool) -> None:
    """Print the library's status lines (logger ``hapi_client.status``) on stderr, unless
    ``quiet``; they are not passed on to the root logger, so ``-v`` shows them once."""
    logger = logging.getLogger("hapi_client.status")
    if quiet or any(isinstance(h.formatter, _StatusFormatter) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_StatusFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _run(args: argparse.Namespace) -> int:
    show_status(bool(getattr(args, "quiet", False)))
    if getattr(args, "workers", 1) > 1:
        if getattr(args, "verify_fraction", 0.0):
            from hapi_client import ConfigurationError

            # The multi-worker trainer streams through each worker's own loader, which does not
            # recompute shards: refuse rather than run unverified while the flag says otherwise.
            raise ConfigurationError(
                "--verify-fraction works with one process only, not with --workers"
            )
        return workers.run_from_args(args)
    if getattr(args, "feature_cache_dir", None):
        from hapi_client import ConfigurationError

        # One process keeps its features in memory only: a disk cache it would not write must
        # not look applied.
        raise ConfigurationError(
            "--feature-cache-dir works with --workers N (N >= 2) only: one process keeps the "
            "extracted features in memory for its later epochs (--no-cache turns that off) and "
            "writes no disk cache"
        )
    import hapi_models

    from hapi_client import HapiClient, SwiftCredentials

    train, extract = options_from_args(args)
    creds = SwiftCredentials(
        args.auth_url or os.environ.get("ST_AUTH") or DEFAULT_AUTH_URL,
        args.user or os.environ.get("ST_USER") or "test:tester",
        args.key or os.environ.get("ST_KEY") or "testing",
    )
    bandwidth = args.bandwidth_mbit * 1e6 / 8 if args.bandwidth_mbit else None
    throttle = args.throttle_mbit * 1e6 / 8 if args.throttle_mbit else None
    with HapiClient(
        args.endpoint,
        creds,
        via=args.via,
        bandwidth_bytes_per_s=bandwidth,
        throttle_bytes_per_s=throttle,
        retry_budget_s=args.retry_budget,
    ) as client:
        result = client.finetune(
            model=args.model,
            container=args.container,
            eval_container=args.eval_container,
            mode=args.mode,
            train=train,
            extract=extract,
            device=args.device,
            progress=not args.quiet,
            verify_fraction=args.verify_fraction,
            checkpoint_dir=getattr(args, "checkpoint_dir", None),
            checkpoint_every=getattr(args, "checkpoint_every", None),
        )
    if result.split is not None:
        print(
            f"split index {result.split.split_index} (freeze {result.freeze_index}): {result.split.reason}"
        )
    rows = [
        {
            "epoch": m.epoch,
            "mode": m.mode,
            "split": m.split_index,
            "loss": f"{m.loss:.4f}",
            "train acc": f"{m.train_accuracy:.3f}",
            "eval acc": "-" if m.eval_accuracy is None else f"{m.eval_accuracy:.3f}",
            "seconds": f"{m.seconds:.1f}",
            "MB/iter": f"{m.bytes_per_iteration / 1e6:.2f}",
            "samples/s": f"{m.samples_per_s:.1f}",
        }
        for m in result.history
    ]
    print(format_table(rows))
    if "verified_samples" in result.extra:
        print(
            f"verified {result.extra['verified_samples']} samples of "
            f"{result.extra['verified_shards']} shards against a local recomputation"
        )
    if args.save:
        digest = hapi_models.save_weights(result.model, args.save)
        print(f"weights saved to {args.save} (sha256 {digest})")
    if args.metrics_json:
        Path(args.metrics_json).write_text(result.to_json())
    return 0


def _fraction(text: str) -> float:
    """A number in [0, 1] (argparse's ``type``: a ValueError is its usage error)."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "finetune",
        help="fine-tune a model from Swift (hapi | baseline | all_in_cos)",
        description="Fine-tune MODEL (a descriptor written by `hapi upload model`, e.g. models/efficientnet_lite0) "
        "on the dataset in CONTAINER. In hapi mode the split is chosen from the measured bandwidth unless forced.",
    )
    p.add_argument("--model", required=True, help="CONTAINER/ARCH, e.g. models/efficientnet_lite0")
    p.add_argument("--container", required=True, help="the training dataset container")
    p.add_argument(
        "--eval-container", help="a held-out dataset container to evaluate on after each epoch"
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="hapi",
        help="hapi: the server runs the frozen head next to Swift and streams features; "
        "baseline: download the raw shards and run every layer here; all_in_cos: the server "
        "fine-tunes too and returns the weights",
    )
    p.add_argument(
        "--split",
        type=_split,
        default="auto",
        help="auto (default: the fastest predicted split from measured costs and bandwidth), "
        "thesis (the thesis' Algorithm 2), freeze, or a layer index",
    )
    p.add_argument(
        "--freeze-index",
        type=int,
        help="layers before this index stay frozen (default: the architecture's)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="samples per training batch")
    p.add_argument("--epochs", type=int, default=1, help="passes over the training container")
    p.add_argument(
        "--optimizer",
        choices=("sgd", "adam", "adamw"),
        default="sgd",
        help="optimizer of the trainable layers",
    )
    p.add_argument("--lr", type=float, default=0.01, help="learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (sgd only)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="L2 weight decay")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the epoch order and the new classifier: the same seed gives the same weights",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the client's layers train: cpu, cuda or cuda:N (with --workers: cuda picks "
        "one GPU per worker)",
    )
    p.add_argument("--image-size", type=int, help="crop size (default: the model's, 224)")
    p.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        default=DEFAULT_OUTPUT_DTYPE.value,
        help="features on the wire (default: %(default)s; float32 to match a local computation)",
    )
    p.add_argument(
        "--compression",
        choices=("none", "zstd"),
        default=DEFAULT_COMPRESSION.value,
        help="compression of the feature stream",
    )
    p.add_argument("--no-cache", action="store_true", help="re-extract features every epoch")
    p.add_argument(
        "--verify-fraction",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="recompute a random fraction F of the shards locally and fail when the server's "
        "features differ beyond the wire dtype's rounding (those shards are also downloaded raw)",
    )
    p.add_argument(
        "--bandwidth-mbit",
        type=float,
        help="the link's bandwidth in Mbit/s for the split decision (default: measured)",
    )
    p.add_argument(
        "--throttle-mbit",
        type=float,
        help="limit this client's transfers to this many Mbit/s (default: no limit)",
    )
    p.add_argument(
        "--retry-budget",
        type=float,
        default=DEFAULT_RETRY_BUDGET_S,
        metavar="SECONDS",
        help="keep retrying a failed request this long, e.g. while `hapi stack up` restarts a "
        "service (default: %(default)s)",
    )
    p.add_argument(
        "--endpoint",
        default=os.environ.get("HAPI_ENDPOINT", DEFAULT_ENDPOINT),
        help=f"URL of the HAPI server (default: $HAPI_ENDPOINT, else {DEFAULT_ENDPOINT})",
    )
    p.add_argument(
        "--via",
        choices=("hapi", "swift"),
        default="hapi",
        help="talk to the HAPI server directly (hapi) or through Swift's HAPI filter (swift)",
    )
    p.add_argument(
        "--auth-url", help=f"Swift auth URL (default: $ST_AUTH, else {DEFAULT_AUTH_URL})"
    )
    p.add_argument("--user", help="Swift account:user (default: $ST_USER, else test:tester)")
    p.add_argument("--key", help="Swift password (default: $ST_KEY, else testing)")
    p.add_argument("--save", help="write the fine-tuned weights here (.safetensors)")
    p.add_argument("--metrics-json", help="write the per-epoch metrics here")
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no status lines and no progress (bars on a terminal, plain lines in a log)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="workers of a robust multi-worker fine-tuning under torchrun (1: one process)",
    )
    workers.add_worker_arguments(p)
    p.set_defaults(func=_run)
