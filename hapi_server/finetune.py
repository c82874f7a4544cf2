"""POST /v1/finetune: the ALL_IN_COS mode (thesis 5.6.4): the server also trains the tail.

The server reads every shard as the caller, fine-tunes layers ``[freeze, n)`` with the same
step as the client's modes (:mod:`hapi_models.finetune`) and returns the whole model's weights as
safetensors, with per-epoch metrics in the ``X-Hapi-Metrics`` header (JSON).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import hapi_models
import torch

from hapi_contract import DatasetFormatError, FinetuneRequest, plan_epoch, read_shard

from .adaptation import make_demand, new_request_id
from .errors import InvalidRequestError, InvalidShardError, PayloadTooLargeError
from .extraction import check_model, load_model, to_transform
from .state import ServerState
from .swift_io import Caller

log = logging.getLogger(__name__)


async def _read_samples(
    state: ServerState, caller: Caller, container: str, shards: list[str], num_classes: int
) -> tuple[list[list[bytes]], list[list[int]]]:
    """Images and labels per shard, in the request's shard order."""
    images: list[list[bytes]] = []
    labels: list[list[int]] = []
    blobs = await asyncio.gather(
        *(
            state.swift.get(caller, container, s, max_bytes=state.settings.max_object_bytes)
            for s in shards
        )
    )
    for name, blob in zip(shards, blobs, strict=True):
        try:
            samples = read_shard(blob.data, num_classes=num_classes)
        except DatasetFormatError as exc:
            raise InvalidShardError(f"shard {container}/{name}: {exc}") from exc
        images.append([s.image_bytes for s in samples])
        labels.append([s.label for s in samples])
    return images, labels


def _train(
    model: hapi_models.SplittableModel,
    req: FinetuneRequest,
    images: list[list[bytes]],
    labels: list[list[int]],
    eval_images: list[list[bytes]],
    eval_labels: list[list[int]],
    device: torch.device,
    max_pixels: int,
) -> tuple[bytes, list[dict[str, Any]]]:
    """Train with the clients' epoch plan and step, so ALL_IN_COS computes what they compute."""
    transform = to_transform(req.transform)
    freeze = req.freeze_index
    model.to(device)
    hapi_models.prepare_for_finetuning(model, freeze)
    opt = hapi_models.OptimizerConfig(
        req.optimizer.name, req.optimizer.lr, req.optimizer.momentum, req.optimizer.weight_decay
    ).build(model.parameters())
    torch.manual_seed(req.seed)  # dropout in the trained layers, seeded as the client's modes do
    head = model.head(freeze)
    tail = model.tail(freeze)
    history: list[dict[str, Any]] = []

    def batches(
        order: list[tuple[int, int]], imgs: list[list[bytes]], labs: list[list[int]]
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for b in range(0, len(order), req.batch_size):
            idx = order[b : b + req.batch_size]
            x = transform.decode_batch([imgs[s][i] for s, i in idx], max_pixels=max_pixels)
            with torch.no_grad():
                h = head(x.to(device))
            yield h, torch.tensor([labs[s][i] for s, i in idx], dtype=torch.int64)

    sizes = [len(shard) for shard in images]
    for epoch in range(req.epochs):
        start = time.perf_counter()
        order = plan_epoch(len(images), req.seed, epoch).sample_order(sizes)
        hapi_models.set_modes(model, freeze, training=True)
        stats = hapi_models.train_batches(tail, batches(order, images, labels), opt, device)
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "loss": stats.loss,
            "train_accuracy": stats.accuracy,
            "samples": stats.samples,
            "seconds": round(time.perf_counter() - start, 3),
        }
        if eval_images:
            hapi_models.set_modes(model, freeze, training=False)
            ev_order = [(s, i) for s, shard in enumerate(eval_images) for i in range(len(shard))]
            record["eval_accuracy"] = hapi_models.evaluate(
                tail, batches(ev_order, eval_images, eval_labels), device
            )
        history.append(record)
    model.eval()
    return hapi_models.weights_to_bytes(model.to("cpu")), history


async def run_finetune(
    state: ServerState, caller: Caller, req: FinetuneRequest
) -> tuple[bytes, dict[str, Any]]:
    spec = check_model(req.model, req.freeze_index, "freeze_index")
    if req.epochs > state.settings.max_finetune_epochs:
        raise InvalidRequestError(
            f"epochs {req.epochs} over the limit of {state.settings.max_finetune_epochs}"
        )
    request_id = req.request_id or new_request_id("ft")
    started = time.perf_counter()
    scheduler = state.pick_scheduler()
    (images, labels), (eval_images, eval_labels) = await asyncio.gather(
        _read_samples(state, caller, req.container, list(req.shards), req.model.num_classes),
        _read_samples(state, caller, req.container, list(req.eval_shards), req.model.num_classes)
        if req.eval_shards
        else asyncio.sleep(0, result=([], [])),
    )
    if sum(map(len, images)) + sum(
        map(len, eval_images)
    ) > state.settings.max_samples_per_request * max(1, len(req.shards)):
        raise PayloadTooLargeError("too many samples for one fine-tuning request")
    entry = await load_model(state, caller, req.model, scheduler)
    transform = to_transform(req.transform)
    try:
        est = state.estimator.estimate(
            req.model.arch,
            req.model.num_classes,
            transform.input_shape,
            spec.num_layers,
            scheduler.device.torch_device.type,
        )
        # Training keeps activations for backward and the optimizer state: a conservative 3x.
        batch = min(req.batch_size, sum(map(len, images)))
        demand = make_demand(request_id, 3 * est.bytes_per_sample, entry.nbytes, batch, batch)
        reservation = await scheduler.acquire(demand)
        model = copy.deepcopy(entry.model)  # never train the shared, cached copy
        if req.target_classes is not None and req.target_classes != req.model.num_classes:
            model.replace_classifier(req.target_classes, seed=req.seed)
    finally:
        state.weights.release(entry)
    try:
        loop = asyncio.get_running_loop()
        blob, history = await loop.run_in_executor(
            state.executor,
            _train,
            model,
            req,
            images,
            labels,
            eval_images,
            eval_labels,
            scheduler.device.torch_device,
            state.settings.max_image_pixels,
        )
    finally:
        scheduler.release(reservation)
    meta = {
        "request_id": request_id,
        "device": scheduler.device.name,
        "epochs": history,
        "server_seconds": round(time.perf_counter() - started, 3),
        "samples": sum(map(len, images)),
        "sha256": hapi_models.sha256_hex(blob),
    }
    log.info(
        "%s: fine-tuned %s for %d epochs in %.1f s",
        request_id,
        req.model.arch,
        req.epochs,
        meta["server_seconds"],
    )
    return blob, meta


def metrics_header(meta: dict[str, Any]) -> str:
    return json.dumps(meta, separators=(",", ":"))
