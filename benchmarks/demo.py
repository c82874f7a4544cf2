"""The ``hapi demo`` job: HAPI vs BASELINE fine-tuning EfficientNet-Lite0 where the network is the bottleneck.

Brings up Swift + the HAPI server on the server cores, uploads the ImageNet-sized photos (a train
and a held-out test container) and the packaged ImageNet weights of EfficientNet-Lite0 (all reused
on a second run), and measures how fast BASELINE computes on the client's cores: that gives the
rate below which BASELINE waits for its link (:mod:`hapi_bench.regime`). Without ``--rate`` the
demo limits the client's link to a third of that rate, inside the network-bound regime HAPI is
for; with ``--rate`` it uses the user's rate and says which regime that is. Then it fine-tunes the
same model on the same data twice: through HAPI with the split chosen by predicted time, and as
BASELINE (download the JPEG shards, run everything on the client). Both evaluate on the test
container. The table compares accuracy, bytes per iteration, epoch time and the split.

Why HAPI wins here: below the crossover rate BASELINE's epoch is its stored bytes over the link,
while HAPI's is the largest of what the server computes (decode and the layers before the split,
on its own core), what the client computes, and the split's bytes over the link; the split rule
picks the split where that largest stage is smallest, so HAPI's epoch shrinks with the bytes it
saves until one side's compute becomes the bottleneck. Above the crossover both modes are bound
by compute and HAPI's gain is the client's share of the work it moves to the server. The demo
fine-tunes the last two stages (freeze index 13), the same job for both modes. The server has the
model loaded before the timed epoch, as it would for any job after the first; the client's one-off
model download is not timed either.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from hapi_client.finetune import Mode
from hapi_client.options import ExtractOptions, TrainOptions

from .data import ensure_dataset, ensure_models, photos_spec
from .demo_config import NETWORK_BOUND_SHARE, DemoConfig
from .regime import measure_regime
from .runs import RunSpec, measured_finetune, warm_server
from .testbed import Testbed

__all__ = ["demo_job", "format_demo_table"]


def _step(n: int, text: str) -> None:
    print(f"[{n}/5] {text}", flush=True)


def format_demo_table(rows: list[dict[str, Any]]) -> str:
    """The demo's table: one line per mode."""
    header = (
        "mode",
        "split",
        "accuracy",
        "MB/iteration",
        "epoch (s)",
        "images/s",
        "bound (s)",
        "fill (s)",
        "drain (s)",
        "steady / bound",
    )
    lines = [header]
    for r in rows:
        split = (
            "-" if r["mode"] == "baseline" else f"{r['split_index']} (freeze {r['freeze_index']})"
        )
        acc = "-" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.3f}"
        lines.append(
            (
                r["mode"].upper(),
                split,
                acc,
                f"{r['bytes_per_iteration'] / 1e6:.2f}",
                f"{r['epoch_s']:.1f}",
                f"{r['samples_per_s']:.1f}",
                f"{r['lower_bound_s']:.1f} ({r['bound_limiter']})",
                "-" if r.get("fill_s") is None else f"{r['fill_s']:.1f}",
                "-" if r.get("drain_s") is None else f"{r['drain_s']:.1f}",
                "-" if r.get("steady_bound_ratio") is None else f"{r['steady_bound_ratio']:.2f}",
            )
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def demo_job(
    testbed: Testbed, config: dict[str, Any] | None = None, results_path: str | None = None
) -> int:
    """The demo on ``testbed``; returns 0 when HAPI beat BASELINE on epoch time and bytes, else 1."""
    cfg = DemoConfig(**(config or {}))
    started = time.perf_counter()
    _step(1, f"starting Swift + the HAPI server ({testbed.cores.describe()})")
    testbed.start_stack()
    testbed.set_rate(None)
    _step(
        2,
        "uploading the photo dataset and the EfficientNet-Lite0 weights (reused when already there)",
    )
    conn = testbed.connection()
    try:
        train = ensure_dataset(
            conn,
            photos_spec("train", cfg.train_per_class),
            f"demo-photos-train-{cfg.train_per_class}",
            cfg.shard_size,
        )
        print(f"      {train.describe()}", flush=True)
        test = ensure_dataset(
            conn,
            photos_spec("test", cfg.test_per_class),
            f"demo-photos-test-{cfg.test_per_class}",
            cfg.shard_size,
        )
        print(f"      {test.describe()}", flush=True)
        stored = ensure_models(conn, [cfg.model])[cfg.model]
        print(
            f"      model {stored.name}: {stored.nbytes / 1e6:.1f} MB, sha256 {stored.sha256[:16]}...",
            flush=True,
        )
    finally:
        conn.close()
    warm_server(testbed, [stored], train.container, train.manifest)
    regime = measure_regime(
        testbed, stored, train.container, train.manifest, cfg.freeze_index, cfg.batch_size
    )
    print(f"      {regime.describe()}", flush=True)
    if cfg.rate_mbit is None:
        rate = round(regime.crossover_mbit * NETWORK_BOUND_SHARE, 1)
        why = f"a third of the crossover rate {regime.crossover_mbit:.1f} Mbit/s: network-bound"
    else:
        rate = cfg.rate_mbit
        bound = "network" if rate < regime.crossover_mbit else "compute"
        why = f"your rate; BASELINE is {bound}-bound there (crossover {regime.crossover_mbit:.1f} Mbit/s)"
    testbed.set_rate(rate)
    check = testbed.measure_link()
    _step(
        3,
        f"link limited to {rate:g} Mbit/s ({why}) by {testbed.link.method}: measured "
        f"{check.measured_mbit:.1f} Mbit/s{' (FLAGGED: more than 10% off)' if check.flagged else ''}",
    )
    rows = []
    modes: tuple[tuple[int, Mode], ...] = ((4, "hapi"), (5, "baseline"))
    for n, mode in modes:
        _step(
            n,
            f"{mode.upper()}: fine-tuning {cfg.model} from layer {cfg.freeze_index} on for {cfg.epochs} "
            f"epoch(s), batch {cfg.batch_size}"
            f"{', split chosen by predicted time' if mode == 'hapi' else ', everything on the client'}",
        )
        spec = RunSpec(
            stored,
            mode,
            train.container,
            train.manifest,
            rate,
            train=TrainOptions(batch_size=cfg.batch_size, epochs=cfg.epochs, lr=cfg.lr),
            extract=ExtractOptions(
                split="auto",
                freeze_index=cfg.freeze_index,
                prefetch=cfg.prefetch,
                cache_features=False,
            ),
            eval_container=test.container,
        )
        result, row = measured_finetune(testbed, spec, check, rate_from_first_data=False)
        if result.split is not None:
            print(f"      split {result.split.split_index}: {result.split.reason}", flush=True)
            print(
                f"      profile {row['profile_ms']:.0f} ms, split choice {row['split_ms']:.2f} ms",
                flush=True,
            )
        rows.append(row)
    testbed.stop_stack()
    hapi, base = rows
    print()
    print(format_demo_table(rows))
    print()
    print(f"link: {check.describe()} via {testbed.link.method}")
    print(
        f"data: {train.manifest.num_samples} training / {test.manifest.num_samples} test photos at "
        f"{train.manifest.mean_shard_bytes_per_sample / 1e3:.0f} KB stored per image; {testbed.cores.describe()}"
    )
    bytes_ratio = base["bytes_per_iteration"] / max(hapi["bytes_per_iteration"], 1.0)
    time_ratio = base["epoch_s"] / max(hapi["epoch_s"], 1e-9)
    won = bytes_ratio > 1 and time_ratio > 1
    regime_word = "network-bound" if rate < regime.crossover_mbit else "compute-bound"
    print(
        f"at {rate:g} Mbit/s ({regime_word} for BASELINE on this machine; crossover "
        f"{regime.crossover_mbit:.1f} Mbit/s)"
    )
    print(
        f"HAPI vs BASELINE: {bytes_ratio:.2f}x fewer bytes per iteration, epoch {time_ratio:.2f}x "
        f"{'faster' if time_ratio > 1 else 'SLOWER'}; wall time of the demo {time.perf_counter() - started:.0f} s"
    )
    if not won:
        busy = max(float(hapi["bound_ratio"] or 0), float(base["bound_ratio"] or 0))
        if busy > 1.3:
            print(
                f"note: an epoch took {busy:.1f}x its lower bound (the CPU time each side got): other work was "
                f"competing for the cores; rerun on an idle machine, or with --nice -10 as root"
            )
    if results_path:
        with open(results_path, "w") as handle:
            json.dump(
                {
                    "config": asdict(cfg),
                    "rate_mbit": rate,
                    "regime": regime.as_dict(),
                    "link": check.as_dict(),
                    "testbed": testbed.describe(),
                    "rows": rows,
                    "hapi_won": won,
                },
                handle,
                indent=2,
            )
    return 0 if won else 1
