"""torchrun entry point: ``torchrun --nproc-per-node N -m hapi_client.distributed CONFIG.json [...]``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .config import DistributedConfig
from .trainer import run_sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m hapi_client.distributed",
        description="One rank of a multi-worker HAPI fine-tuning run (start it under torchrun).",
    )
    parser.add_argument(
        "configs",
        nargs="+",
        metavar="CONFIG",
        help="JSON files written by DistributedConfig.to_json(), run one after the other",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=("debug", "info", "warning", "error")
    )
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
    )
    run_sequence([DistributedConfig.load(path) for path in args.configs])
    return 0


if __name__ == "__main__":
    sys.exit(main())
