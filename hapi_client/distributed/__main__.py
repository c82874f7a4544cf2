"""torchrun entry point: ``torchrun --nproc-per-node N -m hapi_client.distributed CONFIG.json``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .config import DistributedConfig
from .trainer import distributed_finetune


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hapi_client.distributed",
        description="One rank of a multi-worker HAPI fine-tuning run (start it under torchrun).",
    )
    parser.add_argument("config", help="a JSON file written by DistributedConfig.to_json()")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    distributed_finetune(DistributedConfig.load(args.config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
