"""``tenants``: N simultaneous fine-tuning jobs, makespan and average JCT, HAPI vs ALL_IN_COS (Fig 5.11).

As in the thesis' experiment, each tenant submits one job whose training batch is one whole
request (here one shard of 40 photos), the models taken round-robin, all released at once; the
HAPI jobs split at the freeze index, so the client only trains the tail. Each tenant is a thread
with its own :class:`hapi_client.HapiClient`; model downloads happen before a barrier, and a job's
completion time (JCT) counts from the barrier to the moment its client holds the trained model.
The HAPI server has a memory budget, so ALL_IN_COS (whose extraction batch is its training batch)
and HAPI (batch-adapted) differ in how many jobs fit at once, as on the thesis' GPUs.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hapi_client.options import ExtractOptions, TrainOptions

from .data import ensure_photos_and_models
from .plots import plot_tenants
from .results import ResultSet
from .runs import RunSpec, run_concurrently, warm_server
from .testbed import Testbed

__all__ = ["FULL_COUNTS", "QUICK_COUNTS", "TENANT_MODELS", "run_tenants"]

TENANT_MODELS = ("alexnet", "resnet18", "efficientnet_lite0")
RATE_MBIT = 1000.0  # the thesis' default link
BUDGET_BYTES = 3 * 2**30
SHARD = 40
# Up to the thesis' point of 10 simultaneous jobs (Fig 5.11) in both grids; the quick one skips
# the odd counts, which add nothing to the curves' shape.
QUICK_COUNTS = (1, 2, 4, 6, 8, 10)
FULL_COUNTS = tuple(range(1, 11))


def _run_round(testbed: Testbed, specs: list[RunSpec], check: Any) -> dict[str, Any]:
    done = run_concurrently(testbed, specs, check, "tenant")
    jcts = done.walls
    parts = done.sampler.between(done.released, max(done.ends))
    return {
        "makespan_s": round(max(jcts), 3),
        "avg_jct_s": round(statistics.fmean(jcts), 3),
        "jct_s": [round(j, 3) for j in jcts],
        "models": ",".join(s.model.arch for s in specs),
        "storage_cpu_s": round(parts.storage_cpu, 3),
        "client_cpu_s": round(parts.client_cpu, 3),
        "bytes_received": sum(int(r["bytes_received"]) for r in done.rows),
    }


def run_tenants(testbed: Testbed, out_dir: str, quick: bool = True) -> int:
    """The ``tenants`` scenario on ``testbed``; writes ``tenants.json``, ``tenants.csv``, ``tenants.png``."""
    counts = QUICK_COUNTS if quick else FULL_COUNTS
    # Jobs run concurrently on the server (as on the thesis' GPUs), within the memory budget.
    testbed.start_stack(
        settings={"cpu_memory_budget_bytes": BUDGET_BYTES, "max_concurrent_per_device": 8}
    )
    data, stored = ensure_photos_and_models(
        testbed, SHARD // 10, f"bench-tenants-{SHARD}", SHARD, list(TENANT_MODELS)
    )
    warm_server(testbed, list(stored.values()), data.container, data.manifest)
    testbed.set_rate(RATE_MBIT)
    check = testbed.measure_link()
    print(f"[tenants] {data.describe()}; link {check.describe()}", flush=True)
    results = ResultSet.start(
        "tenants",
        testbed=testbed.describe(),
        quick=quick,
        link_check=check.as_dict(),
        budget_bytes=BUDGET_BYTES,
        dataset={
            "container": data.container,
            "source": data.manifest.source,
            "stored_bytes_per_sample": data.manifest.mean_shard_bytes_per_sample,
        },
        job="one shard of 40 photos, training batch 40 (one request), 1 epoch; HAPI split = freeze index",
    )
    for mode in ("hapi", "all_in_cos"):
        for n in counts:
            specs = [
                RunSpec(
                    stored[TENANT_MODELS[i % len(TENANT_MODELS)]],
                    mode,
                    data.container,
                    data.manifest,  # type: ignore[arg-type]
                    RATE_MBIT,
                    train=TrainOptions(batch_size=SHARD),
                    extract=ExtractOptions(split="freeze", cache_features=False),
                    progress=False,
                )
                for i in range(n)
            ]
            row = {
                "mode": mode,
                "tenants": n,
                "dataset": data.container,
                "rate_target_mbit": RATE_MBIT,
                "rate_measured_mbit": round(check.measured_mbit, 2),
                "rate_flagged": check.flagged,
                "stored_bytes_per_sample": round(data.manifest.mean_shard_bytes_per_sample, 1),
                **_run_round(testbed, specs, check),
            }
            results.add(row)
            results.write(Path(out_dir))
            print(
                f"[tenants] {mode:10s} {n:2d} jobs: makespan {row['makespan_s']:7.2f} s, "
                f"average JCT {row['avg_jct_s']:7.2f} s",
                flush=True,
            )
    out = Path(out_dir)
    paths = results.write(out) + plot_tenants(results, out)
    print("[tenants] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0
