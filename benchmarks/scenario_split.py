"""``split``: the chosen split index against bandwidth and against training batch (Table 5.3, Fig 5.12).

Profile-only: each model is profiled once (batch 1, on the meta device) and
:func:`hapi_client.choose_split_index` is asked for every point, with the stored bytes per sample
of the ImageNet-sized photos (JPEG in shards, measured on freshly rendered ones). No stack, no
network: the rule's inputs are exactly what a real run feeds it.

The thesis does not state the training batch of Table 5.3. Its numbers pin it down: split 13 at
1 Gbit/s and 16 at 0.5 Gbit/s for AlexNet mean 62.5 MB < 36,864 B x batch < 125 MB, i.e. a batch
between 1,696 and 3,390; we use 2,000. Figure 5.12 varies the batch at 1 Gbit/s.
"""

from __future__ import annotations

import time
from pathlib import Path

import hapi_models
import torch

from hapi_client import choose_split_index
from hapi_client.datasets import get_source, iter_shards

from .data import photos_spec
from .plots import plot_split
from .results import ResultSet
from .thesis import TABLE_5_3

__all__ = ["run_split", "stored_bytes_per_sample"]

BANDWIDTHS_GBIT = (0.05, 0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0)
BATCHES = (1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000)
BATCH_FOR_BANDWIDTH = 2000
BANDWIDTH_FOR_BATCH_GBIT = 1.0


def stored_bytes_per_sample(per_class: int) -> tuple[float, str]:
    """Mean stored bytes per sample (JPEG + tar framing) of freshly rendered photos, and their spec."""
    spec = photos_spec("test", per_class)
    source = get_source(spec)
    total = samples = 0
    for shard in iter_shards(source, 1000, num_classes=len(source.classes)):
        total += len(shard.data)
        samples += shard.samples
    return total / samples, spec


def run_split(out_dir: str, quick: bool = True) -> int:
    """The ``split`` scenario; writes ``split.json``, ``split.csv`` and ``split.png``."""
    archs = ["alexnet", "resnet18", "efficientnet_lite0"] if quick else hapi_models.thesis_models()
    input_bytes, spec = stored_bytes_per_sample(2 if quick else 10)
    results = ResultSet.start(
        "split",
        quick=quick,
        dataset={"source": spec, "stored_bytes_per_sample": input_bytes},
        batch_for_bandwidth=BATCH_FOR_BANDWIDTH,
        bandwidth_for_batch_gbit=BANDWIDTH_FOR_BATCH_GBIT,
        thesis_table_5_3={
            "bandwidth_gbit": list(TABLE_5_3),
            "split_index": list(TABLE_5_3.values()),
        },
        testbed={"link": "none (profile only)"},
    )
    for arch in archs:
        spec_ = hapi_models.get_spec(arch)
        started = time.perf_counter()
        with torch.device("meta"):
            skeleton = spec_.builder(1000, False)
        profile = hapi_models.profile(skeleton, spec_.transform.input_shape)
        profile_ms = (time.perf_counter() - started) * 1e3
        points = [("bandwidth", g, BATCH_FOR_BANDWIDTH) for g in BANDWIDTHS_GBIT]
        points += [("batch", BANDWIDTH_FOR_BATCH_GBIT, b) for b in BATCHES]
        for sweep, gbit, batch in points:
            t0 = time.perf_counter()
            decision = choose_split_index(
                profile, input_bytes, batch, gbit * 1e9 / 8, spec_.default_freeze_index
            )
            choose_us = (time.perf_counter() - t0) * 1e6
            results.add(
                {
                    "sweep": sweep,
                    "model": arch,
                    "bandwidth_gbit": gbit,
                    "batch_size": batch,
                    "freeze_index": spec_.default_freeze_index,
                    "split_index": decision.split_index,
                    "thesis_split_index": TABLE_5_3.get(gbit)
                    if arch == "alexnet" and sweep == "bandwidth"
                    else None,
                    "output_mb_per_iteration": round(decision.output_bytes_per_batch / 1e6, 2),
                    "input_mb_per_iteration": round(decision.input_bytes_per_batch / 1e6, 2),
                    "stored_bytes_per_sample": round(input_bytes, 1),
                    "profile_ms": round(profile_ms, 2),
                    "choose_us": round(choose_us, 1),
                    "reason": decision.reason,
                }
            )
    out = Path(out_dir)
    paths = results.write(out) + plot_split(results, out)
    for arch in archs:
        row = [r for r in results.rows if r["model"] == arch and r["sweep"] == "bandwidth"]
        print(
            f"[split] {arch:18s} "
            + " ".join(f"{r['bandwidth_gbit']:g}G:{r['split_index']}" for r in row),
            flush=True,
        )
    print("[split] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0
