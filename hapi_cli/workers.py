"""``hapi finetune --workers N``: robust multi-worker fine-tuning under torchrun.

The ``finetune`` command adds these options with :func:`add_worker_arguments` and hands its
parsed arguments to :func:`run_from_args` when ``--workers`` is above 1::

    hapi finetune --model models/efficientnet_lite0 --container fmnist-train \\
        --eval-container fmnist-test --workers 7 --aggregator bulyan --f 1 \\
        --attack reverse --attackers 1 --straggler-delay 0.02 --balance
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hapi_client.robust.names import AGGREGATORS, ATTACKS

from .choices import DEFAULT_AUTH_URL, DEFAULT_ENDPOINT
from .finetune_options import options_from_args
from .tables import format_table

if TYPE_CHECKING:
    # hapi_client loads torch: the functions that need it import it when called, so that building
    # the `finetune` parser (every `hapi --help`) does not.
    from hapi_client.distributed import DistributedConfig, DistributedResult

__all__ = [
    "add_checkpoint_arguments",
    "add_worker_arguments",
    "config_from_args",
    "format_result",
    "run_from_args",
]


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint-dir`` and ``--checkpoint-every``: one process and ``--workers`` alike."""
    group = parser.add_argument_group("checkpoint and resume (one process or --workers)")
    group.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="write a checkpoint here at every epoch's end and resume from the one it holds "
        "(with --workers: a directory every worker sees; not with --mode all_in_cos)",
    )
    group.add_argument(
        "--checkpoint-every",
        type=int,
        metavar="N",
        help="also write a checkpoint every N training iterations (with --workers: rounds); "
        "needs --checkpoint-dir",
    )


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the multi-worker options (everything but ``--workers``, which ``finetune`` owns),
    and the checkpoint options, which one process reads too."""
    add_checkpoint_arguments(parser)
    group = parser.add_argument_group("multi-worker (--workers N > 1, under torchrun)")
    group.add_argument(
        "--aggregator",
        default="average",
        help=f"gradient aggregation rule: {', '.join(AGGREGATORS.names())} (default: %(default)s)",
    )
    group.add_argument(
        "--f",
        type=int,
        default=0,
        help="declared number of Byzantine workers (default: %(default)s)",
    )
    group.add_argument(
        "--q", type=int, help="gradients to wait for per round (default: all workers)"
    )
    group.add_argument(
        "--gather-timeout",
        type=float,
        default=120.0,
        help="seconds the aggregator waits for q gradients before failing (default: %(default)s)",
    )
    group.add_argument(
        "--attack", help=f"simulated attack of the attacker ranks: {', '.join(ATTACKS.names())}"
    )
    group.add_argument(
        "--attackers",
        type=int,
        default=0,
        help="how many workers attack (the highest ranks; default: %(default)s)",
    )
    group.add_argument(
        "--balance",
        action="store_true",
        help="LB-BSP: move samples from the slowest to the fastest worker between rounds",
    )
    group.add_argument(
        "--straggler-delay",
        type=float,
        default=0.0,
        help="make one worker slow: it sleeps this many seconds per sample of its batch",
    )
    group.add_argument(
        "--straggler-rank", type=int, help="the slow worker (default: the last rank)"
    )
    group.add_argument(
        "--checksum-every",
        type=int,
        default=50,
        help="rounds between replica checksum checks (default: %(default)s)",
    )
    group.add_argument(
        "--threads-per-worker",
        type=int,
        default=1,
        help="torch threads per worker (default: %(default)s)",
    )
    group.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="torch.distributed backend (auto: gloo on CPU, NCCL for GPU tensors)",
    )
    group.add_argument("--worker-log", help="keep torchrun's and the workers' output in this file")
    group.add_argument(
        "--feature-cache-dir",
        metavar="DIR",
        help="keep the extracted features on this local disk, so restarted workers do not "
        "fetch them again",
    )
    group.add_argument(
        "--feature-cache-gb",
        type=float,
        default=20.0,
        help="size cap of --feature-cache-dir in GiB (default: %(default)s)",
    )
    group.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="times torchrun restarts the workers after one fails; with --checkpoint-dir they "
        "resume from the last checkpoint (default: %(default)s)",
    )
    group.add_argument(
        "--channel-bind",
        metavar="HOST",
        help="address rank 0's gradient channel listens on: 0.0.0.0 or :: for all interfaces "
        "(default: 127.0.0.1 when every worker runs on this machine, else all interfaces; "
        "or HAPI_CHANNEL_BIND on rank 0's node)",
    )
    group.add_argument(
        "--channel-advertise",
        metavar="HOST",
        help="host name or address the workers connect to for the gradient channel, resolved "
        "by each worker (default: the --channel-bind address if given, else torch's "
        "MASTER_ADDR; or HAPI_CHANNEL_ADVERTISE on rank 0's node); never a loopback address "
        "when workers run on other nodes",
    )


def _opt(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    value = getattr(args, name, default)
    return default if value is None else value


def config_from_args(args: argparse.Namespace) -> DistributedConfig:
    """The :class:`DistributedConfig` that ``hapi finetune`` arguments describe: the shared
    fine-tuning flags through :func:`~hapi_cli.finetune_options.options_from_args`, the
    multi-worker ones here. A flag absent from ``args`` takes its default."""
    from hapi_client.distributed import DistributedConfig, DistributedConfigError

    workers = int(_opt(args, "workers", 1))
    attackers = int(_opt(args, "attackers", 0))
    if not 0 <= attackers < workers:
        raise DistributedConfigError(
            f"--attackers must be in [0, {workers - 1}] with {workers} workers"
        )
    if attackers and not _opt(args, "attack"):
        raise DistributedConfigError("--attackers needs --attack (e.g. --attack reverse)")
    mode = _opt(args, "mode", "hapi")
    if mode not in ("hapi", "baseline"):
        raise DistributedConfigError(
            f"--mode {mode} does not run with several workers; use hapi or baseline"
        )
    train, extract = options_from_args(args)
    delay = float(_opt(args, "straggler_delay", 0.0))
    bandwidth, throttle = _opt(args, "bandwidth_mbit"), _opt(args, "throttle_mbit")
    return DistributedConfig(
        model=args.model,
        container=args.container,
        train=train,
        extract=extract,
        eval_container=_opt(args, "eval_container"),
        endpoint=_opt(args, "endpoint", os.environ.get("HAPI_ENDPOINT", DEFAULT_ENDPOINT)),
        via=_opt(args, "via", "hapi"),
        mode=mode,
        device=_device(_opt(args, "device", "auto")),
        bandwidth_bytes_per_s=bandwidth * 1e6 / 8 if bandwidth else None,
        throttle_bytes_per_s=throttle * 1e6 / 8 if throttle else None,
        backend=_opt(args, "backend", "auto"),
        threads=int(_opt(args, "threads_per_worker", 1)),
        aggregator=_opt(args, "aggregator", "average"),
        f=int(_opt(args, "f", 0)),
        q=_opt(args, "q"),
        gather_timeout_s=float(_opt(args, "gather_timeout", 120.0)),
        attack=_opt(args, "attack"),
        attackers=tuple(range(workers - attackers, workers)),
        balance=bool(_opt(args, "balance", False)),
        straggler_rank=_opt(args, "straggler_rank", workers - 1) if delay > 0 else None,
        straggler_delay_s=delay,
        checksum_every=int(_opt(args, "checksum_every", 50)),
        channel_bind=_opt(args, "channel_bind"),
        channel_advertise=_opt(args, "channel_advertise"),
        results_path=_opt(args, "metrics_json"),
        save_path=_opt(args, "save"),
        progress=not _opt(args, "quiet", False),
        checkpoint_dir=_opt(args, "checkpoint_dir"),
        checkpoint_every=_opt(args, "checkpoint_every"),
        feature_cache_dir=_opt(args, "feature_cache_dir"),
        feature_cache_bytes=max(1, int(float(_opt(args, "feature_cache_gb", 20.0)) * 2**30)),
    )


def _device(value: str) -> str:
    # `hapi finetune` defaults to "cpu"; "cuda" picks one GPU per local rank.
    return value if value in ("auto", "cpu", "cuda") or value.startswith("cuda:") else "auto"


def format_result(result: DistributedResult) -> list[dict[str, object]]:
    """Rows of the per-epoch table printed by ``hapi finetune --workers N``."""
    return [
        {
            "epoch": m.epoch,
            "loss": f"{m.loss:.4f}",
            "train acc": f"{m.train_accuracy:.3f}",
            "eval acc": "-" if m.eval_accuracy is None else f"{m.eval_accuracy:.3f}",
            "seconds": f"{m.seconds:.1f}",
            "rounds": m.rounds,
            "replies used": m.replies_used,
            "MB": f"{m.bytes_received / 1e6:.2f}",
            "ms/round": f"{m.mean_round_seconds * 1e3:.1f}",
            "batch sizes": ",".join(str(s) for s in m.batch_sizes),
        }
        for m in result.history
    ]


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``hapi finetune`` with ``--workers N`` > 1; returns the exit code."""
    from hapi_client import SwiftCredentials
    from hapi_client.distributed import launch

    config = config_from_args(args)
    creds = SwiftCredentials(
        _opt(args, "auth_url") or os.environ.get("ST_AUTH") or DEFAULT_AUTH_URL,
        _opt(args, "user") or os.environ.get("ST_USER") or "test:tester",
        _opt(args, "key") or os.environ.get("ST_KEY") or "testing",
    )
    level = (
        "debug"
        if _opt(args, "debug", False)
        else "info"
        if _opt(args, "verbose", False)
        else "warning"
    )
    result = launch(
        int(args.workers),
        config,
        credentials=creds,
        log_path=_opt(args, "worker_log"),
        log_level=level,
        stream_output=not _opt(args, "quiet", False),
        max_restarts=int(_opt(args, "max_restarts", 0)),
    )
    attack = f"{config.attack} by ranks {list(config.attackers)}" if config.attackers else "none"
    print(
        f"{result.world_size} workers, aggregator {result.aggregator} (q={result.q}, f={result.f}), attack: "
        f"{attack}, split {result.split_index} (freeze {result.freeze_index})"
        + (", LB-BSP on" if result.balance else "")
    )
    print(format_table(format_result(result)))
    if config.save_path:
        print(f"weights saved to {Path(config.save_path)}")
    if config.results_path:
        print(f"metrics written to {config.results_path}")
    return 0
