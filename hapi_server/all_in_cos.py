"""POST /v1/finetune: the ALL_IN_COS mode (thesis 5.6.4): the server also trains the tail.

The server reads every shard as the caller, fine-tunes layers ``[freeze, n)`` with the same
step as the client's modes (:mod:`hapi_models.finetune`) and returns the whole model's weights as
safetensors, with a :class:`hapi_contract.FinetuneMetrics` in the ``X-Hapi-Metrics`` header (JSON).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import hapi_models
import torch

from hapi_contract import FinetuneEpoch, FinetuneMetrics, FinetuneRequest, ImageData, ShardSource
from hapi_contract.epochs import plan_epoch
from hapi_core.adaptation import make_demand, new_request_id
from hapi_core.admission import admit_model, input_transform
from hapi_core.errors import (
    InvalidRequestError,
    InvalidShardError,
    ObjectChangedError,
    PayloadTooLargeError,
)
from hapi_core.estimates import model_footprint
from hapi_core.extraction import (
    plan_weights,
    read_named_samples,
    release_model,
    reserve_and_load,
    source_of,
)
from hapi_core.flow import Flow

from .core_host import ServerHost
from .state import ServerState
from .swift_io import Caller

log = logging.getLogger(__name__)

T = TypeVar("T")


async def gather_bounded(factories: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Await ``factory()`` for each, at most ``limit`` at a time, results in order.

    On the first failure the others are cancelled (a request naming 1000 missing shards
    costs at most ``limit`` more Swift requests, not 999) and that failure is raised as is.
    """
    gate = asyncio.Semaphore(limit)

    async def one(factory: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await factory()

    tasks = [asyncio.create_task(one(f)) for f in factories]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class _ShardSamples:
    """Per shard, in the request's shard order: the encoded images, their labels and their
    names (an image object, or a shard and key), which lead a decode error."""

    images: list[list[ImageData]]
    labels: list[list[int]]
    names: list[list[str]]

    def __getitem__(self, shards: slice) -> _ShardSamples:
        return _ShardSamples(self.images[shards], self.labels[shards], self.names[shards])


class _Sized(Exception):
    """Ends a sizing read where it would plan its bulk: what the read would hold."""

    def __init__(self, nbytes: int, samples: int | None) -> None:
        super().__init__(nbytes, samples)
        self.nbytes = nbytes
        self.samples = samples


def _stop_at_reserve(nbytes: int, samples: int | None) -> Flow[None]:
    raise _Sized(nbytes, samples)
    yield  # a flow (a generator), though it never performs an effect


def _read_size(
    rt: ServerState, source: ShardSource, num_classes: int
) -> Flow[tuple[int, int | None]]:
    """The bytes a shard's read will hold and the most samples they can hold, found as
    :func:`read_named_samples` plans them (a shard's HEAD as the caller; a folder part, a small
    list of names, is read), without reading the bulk."""
    try:
        yield from read_named_samples(rt, source, num_classes, _stop_at_reserve)
    except _Sized as sized:
        return sized.nbytes, sized.samples
    raise AssertionError("read_named_samples plans every read")  # pragma: no cover


@dataclass(frozen=True)
class _ReadPlan:
    """Per shard, in the request's shard order: the bytes its read holds and the most samples
    they can hold (None: not known before the read)."""

    nbytes: list[int]
    samples: list[int | None]

    def bound(self, shards: slice) -> int | None:
        """The most samples ``shards`` can hold, None when one of them is not bounded."""
        counts = self.samples[shards]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


async def _plan_reads(
    state: ServerState, caller: Caller, req: FinetuneRequest, shards: list[str]
) -> _ReadPlan:
    """The memory each shard's read will hold, before any of them is read."""
    host = ServerHost(state, caller)
    num_classes = req.model.num_classes
    size = [
        functools.partial(host.run, _read_size(state, source_of(req, name), num_classes))
        for name in shards
    ]
    results = await gather_bounded(size, state.settings.swift_read_concurrency)
    return _ReadPlan([n for n, _ in results], [c for _, c in results])


def _within_plan(shard: str, planned: int) -> Callable[[int, int | None], Flow[None]]:
    """A read's reserve that checks its bytes against those planned for it: a shard that grew
    since it was sized (overwritten meanwhile) would hold memory nobody planned."""

    def reserve(nbytes: int, samples: int | None) -> Flow[None]:
        if nbytes > planned:
            raise ObjectChangedError(
                f"{shard}: changed while the request was planned ({planned} bytes, now "
                f"{nbytes}); retry"
            )
        return
        yield  # a flow, though it never performs an effect

    return reserve


async def _read_samples(
    state: ServerState, caller: Caller, req: FinetuneRequest, shards: list[str], plan: _ReadPlan
) -> _ShardSamples:
    """Images, labels and the images' names per shard, in the request's shard order, each shard
    checked as ``/v1/extract`` checks it (format, sample count, a folder part's images against
    their pins, every image's header), in the request's layout, within the bytes ``plan``
    sized for it. The names (an image object, or a shard and key) lead the error of an image
    whose body does not decode."""
    host = ServerHost(state, caller)
    num_classes = req.model.num_classes
    read = [
        functools.partial(
            host.run,
            read_named_samples(
                state, source_of(req, name), num_classes, _within_plan(name, planned)
            ),
        )
        for name, planned in zip(shards, plan.nbytes, strict=True)
    ]
    results = await gather_bounded(read, state.settings.swift_read_concurrency)
    return _ShardSamples(
        [images for images, _, _ in results],
        [labels for _, labels, _ in results],
        [names for _, _, names in results],
    )


def _train(
    model: hapi_models.SplittableModel,
    req: FinetuneRequest,
    train: _ShardSamples,
    evaluation: _ShardSamples,
    device: torch.device,
    max_pixels: int,
) -> tuple[bytes, list[FinetuneEpoch]]:
    """Train with the clients' epoch plan and step, so ALL_IN_COS computes what they compute."""
    transform = input_transform(req.transform)
    freeze = req.freeze_index
    model.to(device)
    hapi_models.prepare_for_finetuning(model, freeze)
    opt = hapi_models.OptimizerConfig(**req.optimizer.model_dump()).build(model.parameters())
    torch.manual_seed(req.seed)  # dropout in the trained layers, seeded as the client's modes do
    head = model.head(freeze)
    tail = model.tail(freeze)
    history: list[FinetuneEpoch] = []

    def batches(
        order: list[tuple[int, int]], part: _ShardSamples
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for b in range(0, len(order), req.batch_size):
            idx = order[b : b + req.batch_size]
            try:
                x = transform.decode_batch(
                    [part.images[s][i] for s, i in idx],
                    max_pixels=max_pixels,
                    names=[part.names[s][i] for s, i in idx],
                )
            except hapi_models.ImageDecodeError as exc:
                # Past the header check, only a full decode finds a cut or corrupt body.
                raise InvalidShardError(f"not a decodable image: {exc}") from exc
            with torch.no_grad():
                h = head(x.to(device))
            yield h, torch.tensor([part.labels[s][i] for s, i in idx], dtype=torch.int64)

    sizes = [len(shard) for shard in train.images]
    for epoch in range(req.epochs):
        start = time.perf_counter()
        order = plan_epoch(len(train.images), req.seed, epoch).sample_order(sizes)
        hapi_models.set_modes(model, freeze, training=True)
        stats = hapi_models.train_batches(tail, batches(order, train), opt, device)
        seconds = round(time.perf_counter() - start, 3)
        eval_accuracy = None
        if evaluation.images:
            hapi_models.set_modes(model, freeze, training=False)
            ev_order = [
                (s, i) for s, shard in enumerate(evaluation.images) for i in range(len(shard))
            ]
            eval_accuracy = hapi_models.evaluate(tail, batches(ev_order, evaluation), device)
        history.append(
            FinetuneEpoch(
                epoch=epoch + 1,
                loss=stats.loss,
                train_accuracy=stats.accuracy,
                samples=stats.samples,
                seconds=seconds,
                eval_accuracy=eval_accuracy,
            )
        )
    model.eval()
    return hapi_models.weights_to_bytes(model.to("cpu")), history


def _resident_bytes(arch: str, num_classes: int) -> int:
    return model_footprint(arch, num_classes).resident_bytes


def _training_bytes(req: FinetuneRequest) -> int:
    """Memory of the trained copy: the model (with its new classifier), its gradients and the
    optimizer's state (a momentum buffer for SGD with momentum, two moments for Adam)."""
    fp = _resident_bytes(req.model.arch, req.model.num_classes)
    if req.target_classes is not None and req.target_classes != req.model.num_classes:
        # The new classifier is built while the old one still exists.
        fp += _resident_bytes(req.model.arch, req.target_classes)
    slots = {"sgd": 1 if req.optimizer.momentum > 0 else 0, "adam": 2, "adamw": 2}
    return fp * (2 + slots[req.optimizer.name])


async def run_all_in_cos(
    state: ServerState, caller: Caller, req: FinetuneRequest
) -> tuple[bytes, FinetuneMetrics]:
    """Cheap checks, then the reads' sizes, then admission (the shards' bytes and the model's
    load included), then the reads and the load within it, then the work."""
    spec = admit_model(req.model, req.freeze_index, "freeze_index")
    if req.epochs > state.settings.max_finetune_epochs:
        raise InvalidRequestError(
            f"epochs {req.epochs} over the limit of {state.settings.max_finetune_epochs}"
        )
    request_id = req.request_id or new_request_id("ft")
    started = time.perf_counter()
    scheduler = state.pick_scheduler()
    transform = input_transform(req.transform)
    est = state.estimator.estimate(
        req.model.arch,
        req.model.num_classes,
        transform.input_shape,
        spec.num_layers,
        scheduler.device.torch_device.type,
    )
    train_bytes = _training_bytes(req)
    host = ServerHost(state, caller)
    plan = await host.run(plan_weights(state, req.model, scheduler))
    names = [*req.shards, *req.eval_shards]
    n = len(req.shards)
    try:
        # Every byte planned before it is read, as /v1/extract plans it: the shards' (sized by
        # a HEAD as the caller, a folder part by its list), the weights' download and load, the
        # trained copy and the batches; the reads run inside the admitted memory.
        reads = await _plan_reads(state, caller, req, names)
        bound = reads.bound(slice(0, n))
        batch = max(1, min(req.batch_size, bound if bound is not None else req.batch_size))
        # Training keeps activations for backward and the optimizer state: a conservative 3x.
        demand = make_demand(
            request_id,
            3 * est.bytes_per_sample,
            plan.load_bytes + train_bytes,
            batch,
            batch,
            input_bytes=sum(reads.nbytes),
        )
        reservation, entry = await host.run(reserve_and_load(state, plan, scheduler, demand))
        try:
            samples = await _read_samples(state, caller, req, names, reads)
            train, evaluation = samples[:n], samples[n:]
            if sum(map(len, samples.images)) > state.settings.max_samples_per_request * max(
                1, len(req.shards)
            ):
                raise PayloadTooLargeError("too many samples for one fine-tuning request")
            # The train shards' count is known now: a larger batch would hold memory idle.
            scheduler.shrink(reservation, min(req.batch_size, sum(map(len, train.images))))
            model = copy.deepcopy(entry.model)  # never train the shared, cached copy
            if req.target_classes is not None and req.target_classes != req.model.num_classes:
                model.replace_classifier(req.target_classes, seed=req.seed)
        except BaseException:
            scheduler.release(reservation)
            raise
    finally:
        release_model(state, plan)
    try:
        loop = asyncio.get_running_loop()
        blob, history = await loop.run_in_executor(
            state.executor,
            _train,
            model,
            req,
            train,
            evaluation,
            scheduler.device.torch_device,
            state.settings.max_image_pixels,
        )
    finally:
        scheduler.release(reservation)
    metrics = FinetuneMetrics(
        request_id=request_id,
        device=scheduler.device.name,
        epochs=history,
        server_seconds=round(time.perf_counter() - started, 3),
        samples=sum(map(len, train.images)),
        sha256=hapi_models.sha256_hex(blob),
    )
    log.info(
        "%s: fine-tuned %s for %d epochs in %.1f s",
        request_id,
        req.model.arch,
        req.epochs,
        metrics.server_seconds,
    )
    return blob, metrics
