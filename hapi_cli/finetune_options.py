"""The option objects that ``hapi finetune``'s flags describe, for one worker or several.

Both handlers build their :class:`~hapi_client.options.TrainOptions` and
:class:`~hapi_client.options.ExtractOptions` here: the one-process run in
:mod:`hapi_cli.finetune_cmd` and the multi-worker config in :mod:`hapi_cli.workers`, so a flag
means the same thing either way. Torch-free until called: ``hapi_client`` is imported inside.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hapi_client.options import ExtractOptions, TrainOptions

__all__ = ["options_from_args"]

# Option field -> argparse dest of `hapi finetune`'s flag for it.
_TRAIN_FLAGS = {
    name: name
    for name in ("batch_size", "epochs", "optimizer", "lr", "momentum", "weight_decay", "seed")
}
_EXTRACT_FLAGS = {
    "split": "split",
    "freeze_index": "freeze_index",
    "image_size": "image_size",
    "output_dtype": "dtype",
    "compression": "compression",
}


def options_from_args(args: argparse.Namespace) -> tuple[TrainOptions, ExtractOptions]:
    """The shared option objects that ``hapi finetune``'s arguments describe (one or several
    workers alike). A flag absent from ``args`` (a namespace a library caller built) or left at
    None takes the option's own default."""
    from hapi_client.options import ExtractOptions, TrainOptions

    def given(flags: dict[str, str]) -> dict[str, Any]:
        values = {field: getattr(args, dest, None) for field, dest in flags.items()}
        return {field: value for field, value in values.items() if value is not None}

    extract = given(_EXTRACT_FLAGS)
    if getattr(args, "no_cache", False):
        extract["cache_features"] = False
    return TrainOptions(**given(_TRAIN_FLAGS)), ExtractOptions(**extract)
