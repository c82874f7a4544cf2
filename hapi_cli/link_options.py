"""The options ``hapi demo`` and ``hapi bench`` share: how the link is limited and how nice to be.

Torch-free: only the handlers import ``hapi_bench``.
"""

from __future__ import annotations

import argparse

__all__ = ["add_link_options", "shaping_of", "shaping_reason"]

_SHAPING = {"auto": None, "tc": True, "throttle": False}


def add_link_options(p: argparse.ArgumentParser, what: str) -> None:
    """Add ``--shaping`` and ``--nice`` to ``p``; ``what`` names the processes (demo, benchmark)."""
    p.add_argument(
        "--shaping",
        choices=tuple(_SHAPING),
        default="auto",
        help="tc: require namespaces + tc; throttle: the token bucket (default: best available)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help=f"niceness added to the {what}'s processes; negative (as root) keeps other work on a "
        "shared machine from disturbing the measurements (default: %(default)s)",
    )


def shaping_of(args: argparse.Namespace) -> bool | None:
    """``--shaping`` as the testbed takes it: True (tc), False (throttle) or None (best available)."""
    return _SHAPING[args.shaping]


def shaping_reason(args: argparse.Namespace) -> str | None:
    """Why the link will be throttled rather than shaped with tc (None: it will be shaped)."""
    from hapi_bench import shaping_support

    return shaping_support() if args.shaping != "throttle" else "asked for the throttle"
