"""``oracle``: how close each split rule comes to the best split, measured, per model and rate.

For every model and link rate, one epoch of HAPI fine-tuning runs with the split the default rule
chooses (``split="auto"``, predicted time), one with the thesis' Algorithm 2 (``split="thesis"``),
and one with each of a dense set of other splits; the report gives, per model and rate, each
rule's epoch time over the best measured split's.

Which other splits: every split up to the freeze index, tried in the order of the default rule's
predicted time, except those that cannot win: a split whose bytes alone, over the measured
rate, take longer than the best epoch measured so far is skipped (that time is a physical lower
bound on its epoch). The quick grid measures at most ``QUICK_EXTRA`` of them per point; the full
grid measures every split the bound leaves.

Each run is a real epoch over the shaped link on the testbed's cores (server and storage on
one side, the client on the other), the model already loaded by the server; what is compared is
the first epoch's time, which includes filling the pipeline, as a user's epoch does.

One epoch of a few iterations varies from run to run by as much as the 1.10 the rules are judged
by (AlexNet's epochs of 4 iterations: 3.7 s), and the least of many splits' single epochs is
biased low. So after the sweep, ``CONFIRM_ROUNDS`` more epochs of the two contenders (auto's
split and the fastest other one) run in turns; each split is judged by the least of its epochs,
and the summary gives the spread of the repeated ones (``noise``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hapi_client import FinetuneResult, StoredModel
from hapi_client.options import ExtractOptions, TrainOptions
from hapi_client.planning import SplitChoice

from .data import DatasetReady, ensure_photos_and_models
from .results import ResultSet
from .runs import RunSpec, measured_finetune, warm_server
from .shaping import LinkCheck
from .testbed import Testbed

__all__ = ["oracle_summary", "run_oracle"]

log = logging.getLogger(__name__)

MODELS = ("alexnet", "resnet18", "efficientnet_lite0")
QUICK_RATES_MBIT = (10.0, 50.0, 200.0)
FULL_RATES_MBIT = (5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0)
#: Extra splits per (model, rate) in the quick grid, beyond the two rules' own.
QUICK_EXTRA = 4
#: More epochs of auto's split and of the fastest other split, after the sweep.
CONFIRM_ROUNDS = 2
BATCH = 50


@dataclass
class _Point:
    """One (model, rate) of the grid: its runs and the best epoch time per split so far."""

    testbed: Testbed
    results: ResultSet
    out: Path
    model: StoredModel
    train: DatasetReady
    rate: float
    check: LinkCheck
    measured: dict[int, float] = field(default_factory=dict)

    def run(self, split: SplitChoice, rule: str) -> FinetuneResult:
        spec = RunSpec(
            self.model,
            "hapi",
            self.train.container,
            self.train.manifest,
            self.rate,
            train=TrainOptions(batch_size=BATCH),
            extract=ExtractOptions(split=split, cache_features=False),
            progress=False,
        )
        result, row = measured_finetune(self.testbed, spec, self.check)
        row.pop("extract_timeline", None)  # per-request detail: the e2e scenario keeps it
        row["rule"] = rule
        self.results.add(row)
        self.results.write(self.out)
        split_index = int(row["split_index"])
        epoch = float(row["epoch_s"])
        self.measured[split_index] = min(self.measured.get(split_index, epoch), epoch)
        print(
            f"[oracle] {self.model.arch:18s} {self.rate:6g} Mbit/s {rule:7s} split "
            f"{split_index:>2}  epoch {epoch:7.2f} s  "
            f"{row['bytes_per_iteration'] / 1e6:6.2f} MB/iter",
            flush=True,
        )
        return result

    def measure(self, quick: bool, iterations: int) -> None:
        """The two rules, the other splits that could still win, then the contenders again."""
        auto = self.run("auto", "auto")
        self.run("thesis", "thesis")
        predictions = auto.split.predictions if auto.split is not None else ()
        rate = self.check.measured_mbit * 1e6 / 8
        extra = 0
        for t in sorted(predictions, key=lambda t: t.iteration_s):
            if t.split in self.measured:
                continue
            if quick and extra >= QUICK_EXTRA:
                break
            if t.wire_bytes * iterations / rate >= min(self.measured.values()):
                continue  # its bytes alone take longer than the best epoch so far
            self.run(t.split, "forced")
            extra += 1
        chosen = auto.split.split_index if auto.split is not None else None
        others = sorted((s for s in self.measured if s != chosen), key=self.measured.__getitem__)
        contenders = [s for s in (chosen, *others[:1]) if s is not None]
        for _ in range(CONFIRM_ROUNDS):
            for split in contenders:
                self.run(split, "confirm")


def run_oracle(testbed: Testbed, out_dir: str, quick: bool = True) -> int:
    """The ``oracle`` scenario on ``testbed``; writes ``oracle.json`` and ``oracle.csv``."""
    rates = QUICK_RATES_MBIT if quick else FULL_RATES_MBIT
    per_class = 20 if quick else 40
    out = Path(out_dir)
    testbed.start_stack()
    train, stored = ensure_photos_and_models(
        testbed, per_class, f"bench-photos-{per_class}", BATCH, list(MODELS)
    )
    print(f"[oracle] {train.describe()}; batch {BATCH}; rates {rates} Mbit/s", flush=True)
    warm_server(testbed, list(stored.values()), train.container, train.manifest, every_split=True)
    results = ResultSet.start(
        "oracle",
        testbed=testbed.describe(),
        quick=quick,
        rates_mbit=list(rates),
        batch_size=BATCH,
        dataset={
            "container": train.container,
            "num_samples": train.manifest.num_samples,
            "stored_bytes_per_sample": train.manifest.mean_shard_bytes_per_sample,
        },
        link_checks=[],
    )
    iterations = -(-train.manifest.num_samples // BATCH)
    for rate in rates:
        testbed.set_rate(rate)
        check = testbed.measure_link()
        results.meta["link_checks"].append(check.as_dict())
        print(f"[oracle] link {check.describe()}", flush=True)
        for arch in MODELS:
            point = _Point(testbed, results, out, stored[arch], train, rate, check)
            point.measure(quick, iterations)
    testbed.set_rate(None)
    paths = results.write(out)
    summary = oracle_summary(results.rows)
    print(format_oracle(summary), flush=True)
    results.meta["summary"] = summary
    paths = results.write(out)
    print("[oracle] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0


def oracle_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, rate): the best measured split and each rule's split's epoch over the best's,
    each split judged by the least of its epochs (a rule's own, forced and confirming runs).

    ``noise``: the largest of a split's longest epoch over its shortest, among the splits run
    more than once (1.0 when none was)."""
    points: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        points.setdefault((row["model"], float(row["rate_target_mbit"])), []).append(row)
    out = []
    for (model, rate), group in points.items():
        epochs: dict[int, list[float]] = {}
        for r in group:
            epochs.setdefault(int(r["split_index"]), []).append(float(r["epoch_s"]))
        least = {split: min(times) for split, times in epochs.items()}
        best = min(least, key=least.__getitem__)
        entry: dict[str, Any] = {
            "model": model,
            "rate_mbit": rate,
            "best_split": best,
            "best_epoch_s": least[best],
            "splits_measured": len(epochs),
            "noise": round(
                max((max(t) / min(t) for t in epochs.values() if len(t) > 1), default=1.0), 3
            ),
        }
        for rule in ("auto", "thesis"):
            mine = [r for r in group if r["rule"] == rule]
            if mine:
                split = int(mine[0]["split_index"])
                entry[f"{rule}_split"] = split
                entry[f"{rule}_epoch_s"] = least[split]
                entry[f"{rule}_over_best"] = round(least[split] / least[best], 3)
        out.append(entry)
    return out


def format_oracle(summary: list[dict[str, Any]]) -> str:
    lines = [
        f"{'model':18s} {'Mbit/s':>7s} {'best':>5s} {'best s':>7s}  {'auto':>4s} {'x best':>6s}  "
        f"{'thesis':>6s} {'x best':>6s}  tried  noise"
    ]
    for e in summary:
        lines.append(
            f"{e['model']:18s} {e['rate_mbit']:7g} {e['best_split']:5d} {e['best_epoch_s']:7.2f}  "
            f"{e.get('auto_split', '-'):>4} {e.get('auto_over_best', float('nan')):6.2f}  "
            f"{e.get('thesis_split', '-'):>6} {e.get('thesis_over_best', float('nan')):6.2f}  "
            f"{e['splits_measured']:5d}  {e.get('noise', 1.0):5.2f}"
        )
    return "\n".join(lines)
