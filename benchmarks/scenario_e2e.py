"""``e2e``: epoch time and bytes per iteration of BASELINE, HAPI and ALL_IN_COS (Figures 5.9, 5.10).

For each link rate, model and mode, one epoch of fine-tuning over the ImageNet-sized photos, the
split chosen automatically (HAPI), and for every run the pipelined lower bound
max(storage CPU, client CPU, bytes / measured rate) from the same run's parts. Before the runs,
each model's BASELINE compute per image is measured on the client's core and the crossover rate
(where BASELINE's link keeps up with its compute, :mod:`hapi_bench.regime`) goes into the
results and the plot: below it the network is the bottleneck.

The quick grid (``make bench``) runs AlexNet from 5 to 1000 Mbit/s with HAPI and BASELINE (ALL_IN_COS at
100 and 1000 Mbit/s only: below, its time is the 233 MB model it returns divided by the rate), and
ResNet18 and EfficientNet-Lite0 at 100 Mbit/s; the full grid runs every model at every rate in
every mode and adds the thesis' 0.05-15 Gbit/s sweep for AlexNet with HAPI and BASELINE. The
training batch is the shard size (50), so every iteration is a full batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import hapi_models

from hapi_client.finetune import Mode
from hapi_client.options import TrainOptions

from .data import ensure_photos_and_models
from .plots import plot_e2e
from .regime import measure_regime
from .results import ResultSet
from .runs import RunSpec, measured_finetune, warm_server
from .testbed import Testbed

__all__ = ["E2EGrid", "e2e_grid", "run_e2e"]

log = logging.getLogger(__name__)

MODELS = ("alexnet", "resnet18", "efficientnet_lite0")
RATES_MBIT = (50.0, 100.0, 500.0, 1000.0)
#: The quick sweep of AlexNet: from deep in the network-bound regime on a 2-core machine (its
#: crossover is measured and printed per run, ~40-60 Mbit/s there) to where both modes are
#: compute-bound.
QUICK_SWEEP_MBIT = (5.0, 10.0, 25.0, 50.0, 100.0, 500.0, 1000.0)
MODES = ("baseline", "hapi", "all_in_cos")
THESIS_SWEEP_MBIT = (50.0, 100.0, 500.0, 1000.0, 2000.0, 3000.0, 5000.0, 10000.0, 15000.0)


@dataclass(frozen=True)
class E2EGrid:
    """Which (rate, model, mode) runs, on how many images, at which batch and shard size."""

    runs: tuple[tuple[float, str, str], ...]
    per_class: int
    batch_size: int
    shard_size: int
    note: str

    @property
    def rates(self) -> list[float]:
        return list(dict.fromkeys(r for r, _, _ in self.runs))

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(m for _, m, _ in self.runs))


def e2e_grid(quick: bool, *, tiny: bool = False) -> E2EGrid:
    """The grid of ``hapi bench e2e`` (``tiny``: one small run per mode, for tests)."""
    if tiny:
        runs = tuple((100.0, "efficientnet_lite0", mode) for mode in MODES)
        return E2EGrid(
            runs, 2, 10, 10, "tiny: EfficientNet-Lite0 at 100 Mbit/s on 20 images (a smoke test)"
        )
    if quick:
        quick_runs = [
            (rate, "alexnet", mode)
            for rate in QUICK_SWEEP_MBIT
            for mode in MODES
            if mode != "all_in_cos" or rate in (100.0, 1000.0)
        ]
        quick_runs += [(100.0, model, mode) for model in MODELS[1:] for mode in MODES]
        return E2EGrid(
            tuple(quick_runs),
            30,
            50,
            50,
            "quick: AlexNet at 5/10/25/50/100/500/1000 Mbit/s (ALL_IN_COS at 100 and 1000 only), ResNet18 and "
            "EfficientNet-Lite0 at 100 Mbit/s only, 300 training images",
        )
    full = [(rate, model, mode) for rate in RATES_MBIT for model in MODELS for mode in MODES]
    full += [
        (rate, "alexnet", mode)
        for rate in sorted({*QUICK_SWEEP_MBIT, *THESIS_SWEEP_MBIT})
        if rate not in RATES_MBIT
        for mode in ("baseline", "hapi")
    ]
    return E2EGrid(
        tuple(full),
        50,
        50,
        50,
        "full: every model at 50/100/500/1000 Mbit/s, plus AlexNet HAPI/BASELINE from 5 Mbit/s "
        "over the thesis' 0.05-15 Gbit/s sweep, 500 training images",
    )


def run_e2e(testbed: Testbed, out_dir: str, quick: bool = True, tiny: bool = False) -> int:
    """The ``e2e`` scenario on ``testbed``; writes ``e2e.json``, ``e2e.csv`` and plots."""
    grid = e2e_grid(quick, tiny=tiny)
    print(f"[e2e] grid: {grid.note}; training batch {grid.batch_size}", flush=True)
    out = Path(out_dir)
    testbed.start_stack()
    train, stored = ensure_photos_and_models(
        testbed, grid.per_class, f"bench-photos-{grid.per_class}", grid.shard_size, grid.models
    )
    print(f"[e2e] {train.describe()}", flush=True)
    warm_server(testbed, list(stored.values()), train.container, train.manifest)
    regimes = {}
    for model in grid.models:
        regime = measure_regime(
            testbed,
            stored[model],
            train.container,
            train.manifest,
            hapi_models.get_spec(model).default_freeze_index,
            grid.batch_size,
        )
        regimes[model] = regime.as_dict()
        print(f"[e2e] {model}: {regime.describe()}", flush=True)
    results = ResultSet.start(
        "e2e",
        testbed=testbed.describe(),
        grid=grid.note,
        quick=quick,
        dataset={
            "container": train.container,
            "source": train.manifest.source,
            "num_samples": train.manifest.num_samples,
            "stored_bytes_per_sample": train.manifest.mean_shard_bytes_per_sample,
        },
        batch_size=grid.batch_size,
        regimes=regimes,
        link_checks=[],
        shaping_note="the link is unshaped while the client loads the model (a user caches it) and "
        "shaped from the first dataset byte on",
    )
    link_checks: list[dict[str, Any]] = results.meta["link_checks"]
    for rate in grid.rates:
        testbed.set_rate(rate)
        check = testbed.measure_link()
        link_checks.append(check.as_dict())
        print(f"[e2e] link {check.describe()}", flush=True)
        for run_rate, model, mode in grid.runs:
            if run_rate != rate:
                continue
            spec = RunSpec(
                stored[model],
                cast(Mode, mode),
                train.container,
                train.manifest,
                rate,  # type: ignore[arg-type]
                train=TrainOptions(batch_size=grid.batch_size),
                progress=not tiny,
            )
            _, row = measured_finetune(testbed, spec, check)
            results.add(row)
            print(
                f"[e2e] {model:18s} {rate:6g} Mbit/s {mode:10s} split {row['split_index']:>2}  "
                f"epoch {row['epoch_s']:7.2f} s  {row['bytes_per_iteration'] / 1e6:7.2f} MB/iter  "
                f"bound {row['lower_bound_s']:6.2f} s ({row['bound_limiter']}, x{row['bound_ratio']}; "
                f"fill {row['fill_s']} s, drain {row['drain_s']} s, x{row['steady_bound_ratio']} between)",
                flush=True,
            )
            results.write(out)  # after every run: an interrupted grid keeps what it measured
    testbed.set_rate(None)
    paths = results.write(out)
    paths += plot_e2e(results, out)
    print("[e2e] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0
