"""Fine-tuning from Swift in three modes with one API: ``hapi``, ``baseline``, ``all_in_cos``.

* ``hapi``: the HAPI server runs layers ``[0, split)`` next to Swift and streams features; the
  client runs the frozen layers ``[split, freeze)`` and trains ``[freeze, n)``.
* ``baseline``: the client downloads the raw shards (the same bytes) and runs every layer,
  pipelined: the next shards download and decode while the current one computes.
* ``all_in_cos``: the server fine-tunes too (``POST /v1/finetune``) and returns the weights.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import hapi_models
import torch
from torch import nn
from tqdm import tqdm

from hapi_contract import (
    Compression,
    DatasetManifest,
    ExtractRequest,
    FinetuneRequest,
    OptimizerSpec,
    OutputDtype,
    TransformSpec,
    profile_to_spec,
    read_shard,
)

from .errors import ConfigurationError
from .feature_cache import CachedFeatures, FeatureCache
from .model_store import StoredModel, download_model, resolve_model
from .pipeline import EpochCounters, LoadedShard, ShardLoader, iterate_batches, plan_epoch
from .split import SplitDecision, choose_split_index

log = logging.getLogger(__name__)

Mode = Literal["hapi", "baseline", "all_in_cos"]
MODES: tuple[str, ...] = ("hapi", "baseline", "all_in_cos")


@dataclass
class EpochMetrics:
    epoch: int
    mode: str
    split_index: int
    loss: float
    train_accuracy: float
    eval_accuracy: float | None
    seconds: float
    samples: int
    iterations: int
    bytes_received: int
    bytes_per_iteration: float
    requests: int
    bandwidth_mbit_s: float | None
    samples_per_s: float


@dataclass
class FinetuneResult:
    model: hapi_models.SplittableModel
    history: list[EpochMetrics]
    mode: str
    freeze_index: int
    split: SplitDecision | None = None
    profile_seconds: float = 0.0
    split_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "mode": self.mode,
                "freeze_index": self.freeze_index,
                "split_index": self.split.split_index if self.split else None,
                "split_reason": self.split.reason if self.split else None,
                "profile_seconds": self.profile_seconds,
                "history": [asdict(m) for m in self.history],
            },
            indent=2,
        )


def _transform_spec(t: hapi_models.InputTransform) -> TransformSpec:
    return TransformSpec.from_transform(t)


class _Run:
    """State of one fine-tuning run (kept out of the public signature)."""

    def __init__(self, client: Any, **opts: Any) -> None:
        self.client = client
        self.__dict__.update(opts)


def _raw_loader(
    client: Any, manifest: DatasetManifest, container: str, transform: hapi_models.InputTransform
) -> ShardLoader:
    """BASELINE (and split 0): download the stored shard and decode it locally."""

    def load(k: int) -> LoadedShard:
        info = manifest.shards[k]
        data, _ = client.swift.get(container, info.name)
        samples = read_shard(data)
        x = transform.decode_batch([s.image_bytes for s in samples])
        y = torch.tensor([s.label for s in samples], dtype=torch.int64)
        return LoadedShard(x, y, len(data), 1)

    return load


def _hapi_loader(
    client: Any,
    manifest: DatasetManifest,
    container: str,
    stored: StoredModel,
    split: int,
    transform: hapi_models.InputTransform,
    profile_spec: Any,
    b_max: int,
    dtype: OutputDtype,
    compression: Compression,
    cache: FeatureCache | None,
) -> ShardLoader:
    spec = _transform_spec(transform)
    transform_key = spec.model_dump_json()

    def load(k: int) -> LoadedShard:
        info = manifest.shards[k]
        key = FeatureCache.key(info.etag, stored.sha256, split, transform_key, dtype.value)
        if cache is not None:
            hit = cache.get(key)
            if hit is not None:
                return LoadedShard(hit.features, hit.labels, 0, 0)
        req = ExtractRequest(
            container=container,
            shard=info.name,
            model=stored.ref(),
            split_index=split,
            transform=spec,
            b_max=b_max,
            profile=profile_spec,
            output_dtype=dtype,
            compression=compression,
        )
        got = client.transport.extract(req, num_samples=info.samples)
        feats = got.features if got.features.dtype == torch.float32 else got.features.float()
        if cache is not None:
            cache.put(key, CachedFeatures(feats, got.labels))
        return LoadedShard(feats, got.labels, got.wire_bytes, got.attempts)

    return load


def run_finetune(
    client: Any,
    *,
    model: str | StoredModel,
    container: str,
    eval_container: str | None = None,
    num_classes: int | None = None,
    freeze_index: int | None = None,
    batch_size: int = 64,
    epochs: int = 1,
    optimizer: hapi_models.OptimizerConfig | None = None,
    device: str = "cpu",
    mode: Mode = "hapi",
    split: int | Literal["auto", "freeze"] = "auto",
    seed: int = 0,
    output_dtype: str = "float32",
    compression: str = "none",
    b_max: int | None = None,
    cache_features: bool = True,
    transform: hapi_models.InputTransform | None = None,
    image_size: int | None = None,
    prefetch: int | None = None,
    progress: bool = True,
    max_iterations: int | None = None,
) -> FinetuneResult:
    if mode not in MODES:
        raise ConfigurationError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if batch_size < 1 or epochs < 1:
        raise ConfigurationError("batch_size and epochs must be >= 1")
    optimizer = optimizer or hapi_models.OptimizerConfig()
    dtype = OutputDtype(output_dtype)
    comp = Compression(compression)
    stored = resolve_model(client.swift, model)
    manifest = client.manifest(container)
    eval_manifest = client.manifest(eval_container) if eval_container else None
    classes = num_classes or len(manifest.classes)

    net = download_model(client.swift, stored)
    transform = transform or net.transform
    if image_size is not None:
        # Keep the model's resize/crop ratio and normalisation at another resolution.
        transform = dataclasses.replace(
            transform, resize=round(image_size * transform.resize / transform.crop), crop=image_size
        )
    freeze = net.default_freeze_index if freeze_index is None else freeze_index
    if not 0 <= freeze < net.num_layers:
        raise ConfigurationError(
            f"freeze index {freeze} out of range [0, {net.num_layers - 1}] for {stored.arch}"
        )
    if classes != stored.num_classes:
        net.replace_classifier(classes, seed=seed)

    if mode == "all_in_cos":
        return _all_in_cos(
            client,
            stored,
            net,
            manifest,
            container,
            eval_manifest,
            eval_container,
            classes,
            freeze,
            batch_size,
            epochs,
            optimizer,
            seed,
            transform,
            b_max,
        )

    t0 = time.perf_counter()
    prof = hapi_models.profile(net, transform.input_shape)
    profile_s = time.perf_counter() - t0
    decision: SplitDecision | None = None
    split_s = 0.0
    if mode == "baseline":
        split_index = 0
    else:
        if client.bandwidth.bytes_per_s is None:
            client.swift.probe(container, manifest.shards[0].name)
        t1 = time.perf_counter()
        decision = _decide(
            prof, manifest, batch_size, client.bandwidth.bytes_per_s, freeze, dtype, split
        )
        split_s = time.perf_counter() - t1
        split_index = decision.split_index
    log.info(
        "%s: profile %.1f ms, split %d (freeze %d)",
        stored.arch,
        profile_s * 1e3,
        split_index,
        freeze,
    )

    net = net.to(device)
    hapi_models.prepare_for_finetuning(net, freeze)
    opt = optimizer.build(net.parameters())
    cache = FeatureCache() if cache_features else None
    profile_spec = profile_to_spec(prof)
    depth = prefetch or max(2, math.ceil(batch_size / manifest.shard_size) + 1)
    cos_b_max = b_max or max(1, min(manifest.shard_size, 1000))
    history: list[EpochMetrics] = []
    torch.manual_seed(seed)
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="hapi-prefetch") as pool:

        def loader_for(m: DatasetManifest, cont: str, s: int) -> ShardLoader:
            if mode == "baseline" or s == 0:
                return _raw_loader(client, m, cont, transform)
            return _hapi_loader(
                client, m, cont, stored, s, transform, profile_spec, cos_b_max, dtype, comp, cache
            )

        for epoch in range(epochs):
            start = time.perf_counter()
            frozen = nn.Sequential(*net.layers[split_index:freeze])
            trainable = net.tail(freeze)
            hapi_models.set_modes(net, freeze, training=True)
            counters = EpochCounters()
            plan = plan_epoch(len(manifest.shards), seed, epoch)
            sizes = [s.samples for s in manifest.shards]
            total_iters = math.ceil(manifest.num_samples / batch_size)
            bar = tqdm(
                total=total_iters,
                desc=f"{mode} epoch {epoch + 1}/{epochs}",
                unit="it",
                disable=not progress,
                leave=True,
            )
            batches = iterate_batches(
                plan,
                sizes,
                loader_for(manifest, container, split_index),
                batch_size,
                pool,
                depth,
                counters,
            )

            feats = _through_frozen(
                batches, frozen, device, bar, counters, split_index, start, max_iterations
            )
            stats = hapi_models.train_batches(trainable, feats, opt, device)
            bar.close()
            seconds = time.perf_counter() - start
            eval_acc = None
            if eval_manifest is not None and eval_container is not None:
                eval_acc = _evaluate(
                    net,
                    eval_manifest,
                    loader_for(eval_manifest, eval_container, split_index),
                    split_index,
                    freeze,
                    batch_size,
                    pool,
                    depth,
                    device,
                )
            bw = client.bandwidth.bytes_per_s
            history.append(
                EpochMetrics(
                    epoch=epoch + 1,
                    mode=mode,
                    split_index=split_index,
                    loss=stats.loss,
                    train_accuracy=stats.accuracy,
                    eval_accuracy=eval_acc,
                    seconds=seconds,
                    samples=counters.samples,
                    iterations=counters.iterations,
                    bytes_received=counters.wire_bytes,
                    bytes_per_iteration=counters.wire_bytes / max(1, counters.iterations),
                    requests=counters.requests,
                    bandwidth_mbit_s=bw * 8e-6 if bw else None,
                    samples_per_s=counters.samples / seconds,
                )
            )
            log.info("epoch %d: %s", epoch + 1, history[-1])
            if mode == "hapi" and split == "auto" and decision is not None and bw is not None:
                if client.bandwidth.drifted(decision.budget_bytes):
                    new = _decide(prof, manifest, batch_size, bw, freeze, dtype, split)
                    if new.split_index != split_index:
                        log.info(
                            "bandwidth drifted to %.1f Mbit/s: split %d -> %d",
                            bw * 8e-6,
                            split_index,
                            new.split_index,
                        )
                    decision, split_index = new, new.split_index
    net.eval()
    return FinetuneResult(
        net.cpu(),
        history,
        mode,
        freeze,
        decision,
        profile_s,
        split_s,
        {"cache_hits": cache.hits if cache else 0},
    )


def _through_frozen(
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    frozen: nn.Module,
    device: str,
    bar: tqdm,  # type: ignore[type-arg]
    counters: EpochCounters,
    split_index: int,
    start: float,
    max_iterations: int | None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Run the frozen layers ``[split, freeze)`` without gradients; update the progress bar."""
    for x, y in batches:
        with torch.no_grad():
            h = frozen(x.to(device))
        yield h, y
        elapsed = max(time.perf_counter() - start, 1e-9)
        bar.update(1)
        bar.set_postfix(
            split=split_index,
            MBps=f"{counters.wire_bytes / elapsed / 1e6:.1f}",
            sps=f"{counters.samples / elapsed:.0f}",
        )
        if max_iterations is not None and counters.iterations >= max_iterations:
            return


def _decide(
    prof: hapi_models.ModelProfile,
    manifest: DatasetManifest,
    batch_size: int,
    bandwidth: float | None,
    freeze: int,
    dtype: OutputDtype,
    split: int | str,
) -> SplitDecision:
    if split == "freeze":
        return SplitDecision(freeze, "forced to the freeze index", 0.0, 0.0, 0.0, ())
    if isinstance(split, int):
        if not 0 <= split <= freeze:
            raise ConfigurationError(f"split index {split} must be in [0, freeze index {freeze}]")
        return SplitDecision(split, "forced by the caller", 0.0, 0.0, 0.0, ())
    if split != "auto":
        raise ConfigurationError(f"split must be 'auto', 'freeze' or an index, got {split!r}")
    assert bandwidth is not None
    width = 4 if dtype == OutputDtype.FLOAT32 else 2
    return choose_split_index(
        prof,
        manifest.mean_shard_bytes_per_sample,
        batch_size,
        bandwidth,
        freeze,
        wire_bytes_per_element=width,
    )


def _evaluate(
    net: hapi_models.SplittableModel,
    manifest: DatasetManifest,
    loader: ShardLoader,
    split: int,
    freeze: int,
    batch_size: int,
    pool: ThreadPoolExecutor,
    depth: int,
    device: str,
) -> float:
    hapi_models.set_modes(net, freeze, training=False)
    rest = nn.Sequential(*net.layers[split:])
    plan = plan_epoch(len(manifest.shards), 0, 0, shuffle=False)
    batches = iterate_batches(
        plan,
        [s.samples for s in manifest.shards],
        loader,
        batch_size,
        pool,
        depth,
        EpochCounters(),
        permute=False,
    )
    return hapi_models.evaluate(rest, batches, device)


def _all_in_cos(
    client: Any,
    stored: StoredModel,
    net: hapi_models.SplittableModel,
    manifest: DatasetManifest,
    container: str,
    eval_manifest: DatasetManifest | None,
    eval_container: str | None,
    classes: int,
    freeze: int,
    batch_size: int,
    epochs: int,
    optimizer: hapi_models.OptimizerConfig,
    seed: int,
    transform: hapi_models.InputTransform,
    b_max: int | None,
) -> FinetuneResult:
    req = FinetuneRequest(
        container=container,
        shards=[s.name for s in manifest.shards],
        model=stored.ref(),
        target_classes=classes if classes != stored.num_classes else None,
        freeze_index=freeze,
        transform=_transform_spec(transform),
        batch_size=batch_size,
        epochs=epochs,
        optimizer=OptimizerSpec(
            name=optimizer.name,
            lr=float(optimizer.lr),
            momentum=float(optimizer.momentum),
            weight_decay=float(optimizer.weight_decay),
        ),
        seed=seed,
        b_max=b_max or batch_size,
    )
    start = time.perf_counter()
    blob, meta = client.transport.finetune(req)
    seconds = time.perf_counter() - start
    hapi_models.load_weights(net, blob)
    eval_acc = None
    if eval_manifest is not None and eval_container is not None:
        with ThreadPoolExecutor(max_workers=2) as pool:
            eval_acc = _evaluate(
                net,
                eval_manifest,
                _raw_loader(client, eval_manifest, eval_container, transform),
                0,
                freeze,
                batch_size,
                pool,
                2,
                "cpu",
            )
    history = []
    epochs_meta = meta.get("epochs", [])
    iters = math.ceil(manifest.num_samples / batch_size)
    for i, e in enumerate(epochs_meta):
        history.append(
            EpochMetrics(
                epoch=i + 1,
                mode="all_in_cos",
                split_index=net.num_layers,
                loss=e["loss"],
                train_accuracy=e["train_accuracy"],
                eval_accuracy=eval_acc if i == len(epochs_meta) - 1 else None,
                seconds=e["seconds"] if len(epochs_meta) > 1 else seconds,
                samples=e["samples"],
                iterations=iters,
                bytes_received=len(blob) if i == 0 else 0,
                bytes_per_iteration=(len(blob) if i == 0 else 0) / iters,
                requests=1 if i == 0 else 0,
                bandwidth_mbit_s=None,
                samples_per_s=e["samples"] / max(e["seconds"], 1e-9),
            )
        )
    net.eval()
    return FinetuneResult(
        net, history, "all_in_cos", freeze, None, extra={"server": meta, "wall_seconds": seconds}
    )


def make_shard_loader(
    client: Any,
    manifest: DatasetManifest,
    container: str,
    *,
    split: int,
    transform: hapi_models.InputTransform,
    stored: StoredModel | None = None,
    profile_spec: Any = None,
    b_max: int = 1000,
    output_dtype: OutputDtype = OutputDtype.FLOAT32,
    compression: Compression = Compression.NONE,
    cache: FeatureCache | None = None,
) -> ShardLoader:
    """The shard loader :func:`run_finetune` uses, for other trainers (multi-worker fine-tuning).

    Split 0 (or no ``stored`` model) downloads and decodes the raw shard (BASELINE); otherwise the
    HAPI server returns the features of layer ``split``.
    """
    if split == 0 or stored is None:
        return _raw_loader(client, manifest, container, transform)
    return _hapi_loader(
        client,
        manifest,
        container,
        stored,
        split,
        transform,
        profile_spec,
        b_max,
        output_dtype,
        compression,
        cache,
    )


def decide_split(
    prof: hapi_models.ModelProfile,
    manifest: DatasetManifest,
    batch_size: int,
    bandwidth: float | None,
    freeze: int,
    output_dtype: OutputDtype,
    split: int | str,
) -> SplitDecision:
    """The split :func:`run_finetune` would use (``split`` is ``"auto"``, ``"freeze"`` or an index)."""
    return _decide(prof, manifest, batch_size, bandwidth, freeze, output_dtype, split)
