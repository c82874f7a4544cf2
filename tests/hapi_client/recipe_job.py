"""A single-process fine-tuning run for the resume test, in its own process (the test kills it).

``python tests/hapi_client/recipe_job.py CONFIG.json``: runs the recipe with the config's
checkpoint directory, appends each training batch's labels to ``labels_path`` (one JSON line
per iteration) and, at iteration ``stop_at``, stops before training (waits until killed), so
the test's SIGKILL lands at a known point right after a mid-epoch checkpoint.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import hapi_models
import torch

from hapi_client import ExtractOptions, HapiClient, SwiftCredentials, TrainOptions
from hapi_contract import OutputDtype

TRANSFORM = hapi_models.InputTransform(
    resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)
)


def options(seed: int = 3, epochs: int = 2) -> tuple[TrainOptions, ExtractOptions]:
    """The run the test compares: the job and the test's in-process runs use the same."""
    train = TrainOptions.with_optimizer(
        hapi_models.OptimizerConfig("sgd", lr=0.05, momentum=0.9),
        batch_size=4,
        epochs=epochs,
        seed=seed,
    )
    return train, ExtractOptions(split="freeze", output_dtype=OutputDtype.FLOAT32)


def main(config_path: str) -> None:
    cfg: dict[str, Any] = json.loads(Path(config_path).read_text())
    torch.set_num_threads(1)
    real_step = hapi_models.train_step
    labels = Path(cfg["labels_path"])
    count = 0

    def recording_step(*args: Any, **kwargs: Any) -> tuple[float, int]:
        nonlocal count
        count += 1
        if count == cfg["stop_at"]:
            threading.Event().wait()  # until the test kills this process
        with labels.open("a") as out:
            out.write(json.dumps(args[2].tolist()) + "\n")
        return real_step(*args, **kwargs)

    hapi_models.train_step = recording_step
    train, extract = options()
    creds = SwiftCredentials(**cfg["credentials"])
    with HapiClient(cfg["endpoint"], creds) as client:
        client.finetune(
            model=cfg["model"],
            container=cfg["container"],
            train=train,
            extract=extract,
            transform=TRANSFORM,
            progress=False,
            checkpoint_dir=cfg["checkpoint_dir"],
            # One checkpoint mid-epoch, the iteration before ``stop_at``: the kill lands right
            # after it. (Every iteration's wrote AlexNet's trainable tail and its momentum, about
            # 130 MB, twenty times for nothing.)
            checkpoint_every=cfg["stop_at"] - 1,
        )


if __name__ == "__main__":
    main(sys.argv[1])
