"""``sweep``: 1, 2 and 4 concurrent fine-tunes of one backbone on one dataset and split (issue 32).

A hyperparameter sweep runs k jobs that ask the HAPI server for the same features. Each job is a
thread with its own :class:`hapi_client.HapiClient` (feature caches off), released together
behind a barrier; per round the scenario reports each job's wall time and, from the server's
``/metrics``, the seconds it spent decoding and running the head
(``hapi_extract_compute_seconds``: stage wall times, which grow when jobs share a core) and
its CPU seconds (sampled from /proc), the object bytes it read from Swift as the callers
(``hapi_swift_read_bytes``), and the feature store's hits and coalesced requests.

Two server settings: ``store off`` (every job pays the whole extraction, as before issue 32) and
``store on`` (``feature_store_bytes``: concurrent identical requests coalesce, later ones hit the
store). With the store on, each round starts a fresh stack, so no round is served by another's
store; each stack is warmed with one float32 extraction at the jobs' split (another key).

Two splits (:data:`SPLITS`): the freeze index, where each job also trains the backbone's last
block on the client, and a linear probe (the classifier alone on the client), where the server
is the bound however many jobs share the client's cores: the issue's wall-time goal is stated
for that case.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import hapi_models
import httpx
from prometheus_client.parser import text_string_to_metric_families

from hapi_client.options import ExtractOptions, TrainOptions
from hapi_contract import ExtractRequest, OutputDtype, TransformSpec

from .data import ensure_photos_and_models
from .results import ResultSet
from .runs import RunSpec, run_concurrently
from .testbed import Testbed

__all__ = ["COUNTS", "run_sweep"]

ARCH = "resnet18"
RATE_MBIT = 1000.0
BUDGET_BYTES = 3 * 2**30
STORE_BYTES = 512 * 2**20
SHARD = 40
COUNTS = (1, 2, 4)
SPLITS = ("freeze", "probe")
"""The jobs' split: the freeze index, or ``probe`` (every layer but the classifier)."""
_METRICS = {
    "compute_s": "hapi_extract_compute_seconds_total",
    "swift_read_bytes": "hapi_swift_read_bytes_total",
    "computations": "hapi_extract_computations_total",
    "store_hits": "hapi_feature_store_hits_total",
    "store_coalesced": "hapi_feature_store_coalesced_total",
}


def _scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {k: 0.0 for k in _METRICS}
    names = {v: k for k, v in _METRICS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                found[names[sample.name]] += float(sample.value)
    return found


def _start(testbed: Testbed, store_bytes: int) -> None:
    testbed.start_stack(
        settings={
            "cpu_memory_budget_bytes": BUDGET_BYTES,
            "max_concurrent_per_device": 4,
            "feature_store_bytes": store_bytes,
        }
    )


def split_index(arch: str, split: str) -> int:
    """The layer index of one of :data:`SPLITS` for ``arch``."""
    spec = hapi_models.get_spec(arch)
    return spec.default_freeze_index if split == "freeze" else spec.num_layers - 1


def _load_model(testbed: Testbed, stored: Any, container: str, manifest: Any, split: int) -> None:
    """Warm the server with one extraction at the jobs' split (the model loaded, the head's
    layout chosen) in float32: another key than the jobs' (their wire dtype is the default
    bfloat16), so the store holds nothing they ask for."""
    testbed.set_rate(None)
    shard = manifest.shards[0]
    spec = hapi_models.get_spec(stored.arch)
    t = spec.transform
    with testbed.client() as client:
        client.transport.extract(
            ExtractRequest(
                container=container,
                shard=shard.name,
                model=stored.ref(),
                split_index=split,
                output_dtype=OutputDtype.FLOAT32,
                transform=TransformSpec(resize=t.resize, crop=t.crop, mean=t.mean, std=t.std),
                b_max=shard.samples,
            ),
            num_samples=shard.samples,
        )


def _round(testbed: Testbed, specs: list[RunSpec], check: Any) -> dict[str, Any]:
    url = testbed.stack.hapi_url
    assert url is not None
    before = _scrape(url)
    done = run_concurrently(testbed, specs, check, "sweep")
    after = _scrape(url)
    walls = done.walls
    used = {k: after[k] - before[k] for k in _METRICS}
    # CPU seconds, unlike the reported stage seconds, do not grow when jobs share a core.
    parts = done.sampler.between(done.released, max(done.ends))
    return {
        "server_cpu_s": round(parts.server_cpu, 3),
        "storage_cpu_s": round(parts.storage_cpu, 3),
        # The jobs are threads of this process: their training, on the client's cores.
        "client_cpu_s": round(parts.client_cpu, 3),
        "wall_s": [round(w, 3) for w in walls],
        "slowest_wall_s": round(max(walls), 3),
        "mean_wall_s": round(statistics.fmean(walls), 3),
        "server_compute_s": round(used["compute_s"], 3),
        "swift_read_bytes": int(used["swift_read_bytes"]),
        "computations": int(used["computations"]),
        "store_hits": int(used["store_hits"]),
        "store_coalesced": int(used["store_coalesced"]),
    }


def run_sweep(testbed: Testbed, out_dir: str, quick: bool = True) -> int:
    """The ``sweep`` scenario on ``testbed``; writes ``sweep.json`` and ``sweep.csv``."""
    per_class = 8 if quick else 20
    _start(testbed, 0)
    data, stored = ensure_photos_and_models(
        testbed, per_class, f"bench-sweep-{per_class}x{SHARD}", SHARD, [ARCH]
    )
    model = stored[ARCH]
    testbed.set_rate(RATE_MBIT)
    check = testbed.measure_link()
    print(f"[sweep] {data.describe()}; link {check.describe()}", flush=True)
    results = ResultSet.start(
        "sweep",
        testbed=testbed.describe(),
        quick=quick,
        link_check=check.as_dict(),
        model=ARCH,
        store_bytes=STORE_BYTES,
        dataset={"container": data.container, "samples": data.manifest.num_samples},
        shard_samples=SHARD,
        job=f"{ARCH}, 1 epoch, training batch {SHARD} (one shard a request), client feature "
        "caches off, all jobs released together",
        splits={name: split_index(ARCH, name) for name in SPLITS},
    )
    for name in SPLITS:
        split = split_index(ARCH, name)
        for store in ("off", "on"):
            for n in COUNTS:
                if store == "on" or n == COUNTS[0]:
                    _start(testbed, STORE_BYTES if store == "on" else 0)
                    _load_model(testbed, model, data.container, data.manifest, split)
                    testbed.set_rate(RATE_MBIT)
                row = {
                    "split": name,
                    "split_index": split,
                    "store": store,
                    "jobs": n,
                    **_round(testbed, _jobs(model, data, n, split), check),
                }
                results.add(row)
                results.write(Path(out_dir))
                print(
                    f"[sweep] split {name} ({split}), store {store:3s} {n} jobs: slowest "
                    f"{row['slowest_wall_s']:6.2f} s, server compute {row['server_compute_s']:6.2f} "
                    f"s (CPU {row['server_cpu_s']:6.2f} s), client CPU {row['client_cpu_s']:6.2f} "
                    f"s, Swift read {row['swift_read_bytes'] / 2**20:7.2f} MiB, computations "
                    f"{row['computations']}, hits {row['store_hits']}, coalesced "
                    f"{row['store_coalesced']}",
                    flush=True,
                )
    paths = results.write(Path(out_dir))
    print("[sweep] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0


def _jobs(model: Any, data: Any, n: int, split: int) -> list[RunSpec]:
    """``n`` fine-tunes that differ in their seed only (a sweep's shape), each training the
    layers from ``split`` on (its freeze index) and split there."""
    return [
        RunSpec(
            model,
            "hapi",
            data.container,
            data.manifest,
            RATE_MBIT,
            train=TrainOptions(batch_size=SHARD, seed=i),
            extract=ExtractOptions(split="freeze", freeze_index=split, cache_features=False),
            progress=False,
        )
        for i in range(n)
    ]
