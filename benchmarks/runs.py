"""One measured fine-tuning run on a testbed: the row every end-to-end result is made of."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import hapi_models
import torch

from hapi_client import FinetuneResult, RetryPolicy, StoredModel, prepare_model
from hapi_client.options import ExtractOptions, TrainOptions
from hapi_client.planning import measure_pipeline_costs
from hapi_client.preparation import cos_batch_cap
from hapi_contract import DatasetManifest, ExtractRequest, ShardSource, TransformSpec
from hapi_core.timing_cache import SETTLE_MEASUREMENTS

from .data import MODELS_CONTAINER
from .errors import BenchError
from .instrument import ClientProbe, Sampler, lower_bound
from .shaping import LinkCheck, mbit_to_bytes
from .testbed import Testbed

__all__ = [
    "ConcurrentRound",
    "RunSpec",
    "measured_finetune",
    "run_concurrently",
    "settle_server_timings",
    "warm_server",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """What to fine-tune, how, and over which link rate (None: unshaped)."""

    model: StoredModel
    mode: Literal["hapi", "baseline", "all_in_cos"]
    container: str
    manifest: DatasetManifest
    rate_mbit: float | None
    train: TrainOptions = field(default_factory=TrainOptions)
    extract: ExtractOptions = field(default_factory=lambda: ExtractOptions(cache_features=False))
    """The library's options (a measured epoch extracts: no feature cache by default);
    ``hapi_bench.wire_dtypes`` measured the wire dtypes, ``prefetch`` is shards in flight."""
    eval_container: str | None = None
    progress: bool = True
    via: Literal["hapi", "swift"] = "hapi"


def warm_server(
    testbed: Testbed,
    models: list[StoredModel],
    container: str,
    manifest: DatasetManifest,
    *,
    via: str = "hapi",
    every_split: bool = False,
) -> None:
    """Load each model into the HAPI server's weights cache with one cheap extraction.

    A server loads a model once and serves every later job from memory; without this the first
    measured run of each model would also time the weights' download and verification. With
    ``every_split``, one extraction at each split from 1 to the freeze index: the server folds
    and times the layout of each head once and keeps it (``docs/server.md``), so a scenario
    comparing one epoch per split does not charge that to whichever split runs first.
    """
    testbed.set_rate(None)
    shard = manifest.shards[0]
    source = ShardSource.of(manifest, container, 0)  # any layout: shards, folder, webdataset
    with testbed.client(via=via) as client:
        for stored in models:
            spec = hapi_models.get_spec(stored.arch)
            t = spec.transform
            freeze = spec.default_freeze_index
            for split in range(1, freeze + 1) if every_split else (freeze,):
                client.transport.extract(
                    ExtractRequest(
                        **source.request_fields(),
                        model=stored.ref(),
                        split_index=split,
                        transform=TransformSpec(
                            resize=t.resize, crop=t.crop, mean=t.mean, std=t.std
                        ),
                        b_max=shard.samples,
                    ),
                    num_samples=shard.samples,
                )


def settle_server_timings(
    testbed: Testbed, models: list[StoredModel], container: str, batch_size: int
) -> None:
    """Have the HAPI server time each model's head as the planner asks for it until it keeps the
    timings (``SETTLE_MEASUREMENTS`` requests, ``docs/server.md``): the plans measured after this
    are those of a server that has timed the network before, which a split rule's
    seconds-to-decide goal is stated for. The link is unshaped meanwhile."""
    testbed.set_rate(None)
    options = ExtractOptions()
    with testbed.client() as client:
        for stored in models:
            prepared = prepare_model(client, stored, container)
            for _ in range(SETTLE_MEASUREMENTS):
                measure_pipeline_costs(
                    client.swift,
                    client.transport,
                    prepared,
                    container,
                    output_dtype=options.output_dtype,
                    compression=options.compression,
                    device=torch.device("cpu"),
                    b_max=cos_batch_cap(prepared.manifest, options.b_max, batch_size),
                )


def _steady_ratio(
    fill_s: float | None, last_s: float | None, bound_s: float, iterations: int
) -> float | None:
    """The time between the first and the last batch's arrival over the bound's share of those
    ``iterations - 1`` iterations: how close the full pipeline runs to its bound. Filling it
    (until the first batch) and draining it (training the last one) are reported on their own:
    in a short epoch each is a whole stage time no pipeline can hide."""
    if fill_s is None or last_s is None or iterations < 2 or bound_s <= 0:
        return None
    return round((last_s - fill_s) / (bound_s * (iterations - 1) / iterations), 3)


def _first_epoch_start(probe: ClientProbe, mode: str) -> float:
    start = probe.first_load_at if mode != "all_in_cos" else probe.first_data_at
    if start is None:
        raise BenchError("the run read no data: nothing to measure")
    return start


def measured_finetune(
    testbed: Testbed,
    spec: RunSpec,
    link: LinkCheck,
    *,
    barrier: threading.Barrier | None = None,
    sampler: Sampler | None = None,
    rate_from_first_data: bool = True,
) -> tuple[FinetuneResult, dict[str, Any]]:
    """Run ``spec`` once and return the result and its row (first epoch's numbers and bound).

    With ``rate_from_first_data`` the link is unshaped while the client loads the model and
    shaped to ``spec.rate_mbit`` from the first dataset byte on; without it the caller sets the
    rate. ``barrier`` makes simultaneous runs start their data together; such runs share one
    ``sampler`` (started by the caller).
    """
    if rate_from_first_data:
        testbed.set_rate(None)
    stack = testbed.stack
    client = testbed.client(
        via=spec.via, retry=RetryPolicy(attempts=8, backoff_s=0.2, max_backoff_s=4.0)
    )
    probe = ClientProbe(
        client,
        models_container=MODELS_CONTAINER,
        on_first_data=(lambda: testbed.set_rate(spec.rate_mbit)) if rate_from_first_data else None,
        barrier=barrier,
    )
    own_sampler = sampler is None
    if sampler is None:
        sampler = Sampler(list(stack.pids.values()), stack.server_pid, testbed.link)
        sampler.__enter__()
    started = time.perf_counter()
    try:
        with client:
            result = client.finetune(
                model=spec.model,
                container=spec.container,
                eval_container=spec.eval_container,
                mode=spec.mode,
                train=spec.train,
                extract=spec.extract,
                progress=spec.progress,
            )
        ended = time.perf_counter()
    finally:
        if own_sampler:
            sampler.__exit__(None, None, None)
    first = result.history[0]
    epoch_start = _first_epoch_start(probe, spec.mode)
    parts = sampler.between(epoch_start, epoch_start + first.seconds)
    rate = mbit_to_bytes(link.measured_mbit)
    bound = lower_bound(
        parts.storage_cpu,
        parts.client_cpu,
        first.bytes_received,
        rate,
        sequential=spec.mode == "all_in_cos",
    )
    manifest = spec.manifest
    split = result.split
    row: dict[str, Any] = {
        "model": spec.model.arch,
        "mode": spec.mode,
        "rate_target_mbit": spec.rate_mbit,
        "rate_measured_mbit": round(link.measured_mbit, 2),
        "rate_flagged": link.flagged,
        "link": link.kind,
        "dataset": spec.container,
        "dataset_source": manifest.source,
        "num_samples": manifest.num_samples,
        "stored_bytes_per_sample": round(manifest.mean_shard_bytes_per_sample, 1),
        "batch_size": spec.train.batch_size,
        "shard_size": manifest.shard_size,
        "freeze_index": result.freeze_index,
        "split_index": first.split_index,
        "split_reason": split.reason if split else None,
        "output_dtype": spec.extract.output_dtype.value,
        "compression": spec.extract.compression.value,
        "bandwidth_estimate_mbit": None
        if first.bandwidth_mbit_s is None
        else round(first.bandwidth_mbit_s, 2),
        "epoch_s": round(first.seconds, 3),
        "iterations": first.iterations,
        "bytes_received": first.bytes_received,
        "bytes_per_iteration": round(first.bytes_per_iteration, 1),
        "requests": first.requests,
        "samples_per_s": round(first.samples_per_s, 2),
        "train_accuracy": round(first.train_accuracy, 4),
        "eval_accuracy": None
        if result.history[-1].eval_accuracy is None
        else round(result.history[-1].eval_accuracy, 4),
        "loss": round(first.loss, 4),
        "client_cpu_s": round(parts.client_cpu, 3),
        "storage_cpu_s": round(parts.storage_cpu, 3),
        "server_cpu_s": round(parts.server_cpu, 3),
        "server_reported_compute_s": round(probe.server_compute_s(), 3),
        "network_s": round(bound.network_s, 3),
        "lower_bound_s": round(bound.seconds, 3),
        "bound_ratio": round(first.seconds / bound.seconds, 3) if bound.seconds > 0 else None,
        "fill_s": None if first.first_batch_s is None else round(first.first_batch_s, 3),
        "drain_s": None
        if first.last_batch_s is None
        else round(first.seconds - first.last_batch_s, 3),
        "steady_bound_ratio": _steady_ratio(
            first.first_batch_s, first.last_batch_s, bound.seconds, first.iterations
        ),
        "bound_limiter": bound.limiter,
        "link_rx_bytes": parts.rx,
        "link_tx_bytes": parts.tx,
        "profile_ms": round(result.profile_seconds * 1e3, 2),
        "split_ms": round(result.split_seconds * 1e3, 3),
        "setup_s": round(epoch_start - started, 2),
        "run_s": round(ended - started, 2),
        "extract_timeline": [
            {
                "shard": r.shard,
                "start_s": round(r.started - epoch_start, 3),
                "seconds": round(r.seconds, 3),
                "server_ms": r.server_ms,
                "cos_batches": r.cos_batch_sizes,
            }
            for r in sorted(probe.extracts, key=lambda r: r.started)
        ],
        "epochs": [
            {
                "epoch": m.epoch,
                "seconds": round(m.seconds, 3),
                "bytes_received": m.bytes_received,
                "requests": m.requests,
                "eval_accuracy": m.eval_accuracy,
            }
            for m in result.history
        ],
    }
    log.info("%s %s %s: %.1f s", spec.model.arch, spec.mode, spec.rate_mbit, first.seconds)
    return result, row


@dataclass
class ConcurrentRound:
    """Simultaneous runs: each one's row and end time, from the moment their data started
    together (``released``), and the sampler that watched them."""

    rows: list[dict[str, Any]]
    released: float
    ends: list[float]
    sampler: Sampler

    @property
    def walls(self) -> list[float]:
        return [end - self.released for end in self.ends]


def run_concurrently(
    testbed: Testbed, specs: list[RunSpec], link: LinkCheck, name: str
) -> ConcurrentRound:
    """Run every spec at once, one thread each, their data starting together (a barrier),
    under one sampler; the first failure is raised once all have stopped."""
    released: list[float] = []
    barrier = threading.Barrier(len(specs), action=lambda: released.append(time.perf_counter()))
    rows: list[dict[str, Any]] = [{} for _ in specs]
    ends = [0.0] * len(specs)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            _, rows[i] = measured_finetune(
                testbed,
                specs[i],
                link,
                barrier=barrier,
                sampler=sampler,
                rate_from_first_data=False,
            )
            ends[i] = time.perf_counter()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
            barrier.abort()

    stack = testbed.stack
    with Sampler(list(stack.pids.values()), stack.server_pid, testbed.link) as sampler:
        threads = [
            threading.Thread(target=one, args=(i,), name=f"{name}-{i}") for i in range(len(specs))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return ConcurrentRound(rows, released[0], ends, sampler)
