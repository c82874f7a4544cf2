"""A timing request: time a model's head on this host's device, layer by layer.

The client predicts the pipeline's time per iteration for every split before it chooses one
(``hapi_client.planning.time_rule``); the server's share must be measured here, on the device and with
the threads that will run it. A timing request is admitted exactly like an extract request
(same checks, same memory planning, the caller's own shard and weights), then, instead of
streaming, runs its first images through the layers one at a time: the decode, every layer and
the encoding of every layer's output at the request's dtype and compression are timed, and the
encoded sizes are what the wire would carry. The measurements are kept per (architecture,
class count, input shape, device, wire dtype and compression), never per weights or per caller
(:mod:`hapi_core.timing_cache`): once ``SETTLE_MEASUREMENTS`` requests have measured the
layers, a later request for them, by any user, is answered from the fastest time seen per layer
after timing only its own images' decode, which takes milliseconds where running the head took
seconds; until then each request measures them again (no warm-up: the kernels are warm) and
lowers what is kept, so that one measurement disturbed by a passing load does not decide every
later plan. The first request for a model on a device runs one untimed warm-up pass before the
timed one; a request for more layers than were measured runs them all.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import hapi_models
import torch

from hapi_contract import ImageData, TimingsRequest, TimingsResponse
from hapi_contract.frames import FrameEncoder

from .admission import input_transform
from .answers import raising_server_errors
from .engine import BatchExecutionError
from .extraction import finish, prepare
from .flow import Compute, Flow
from .forward_turns import turn_taker
from .runtime import CoreRuntime
from .timing_cache import LayerTimes, TimingKey

__all__ = ["HeadMeasurement", "measure_head", "time_head", "time_request"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadMeasurement:
    decode_s_per_sample: float
    layer_s_per_sample: list[float]
    encode_s_per_sample: list[float]
    wire_bytes_per_sample: list[float]
    samples: int = 0
    """The images the layers were timed over."""


def measure_head(
    model: hapi_models.SplittableModel,
    split: int,
    images: Sequence[ImageData],
    transform: hapi_models.InputTransform,
    device: torch.device,
    encoder: FrameEncoder,
    max_pixels: int,
    *,
    warm_up: bool,
    names: Sequence[str] | None = None,
    known_s: float | None = None,
    folder: hapi_models.BatchNormFolder | None = None,
    layouts: bool = False,
    turn: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> HeadMeasurement:
    """Decode ``images`` and run them through layers ``[0, split)`` one layer at a time.

    The layers run as an extraction runs them: with their batch norms folded where ``folder``
    folds (the folds are the extraction's own, made here when missing; a folded pair's time is
    its convolution layer's, the norm layer's 0), and with ``layouts`` each one timed on a
    contiguous and on a ``channels_last`` input, the faster kept (the extraction runs its head
    in the layout that is faster for it: :class:`hapi_models.LayoutChooser`), and once where the
    input has no ``channels_last`` form (a transformer's tokens). Each pass holds
    ``turn`` (a turn at the CPU's cores, as a forward pass does), so other requests' forwards
    do not inflate the times.

    With ``warm_up`` an untimed pass runs first (allocator and kernel caches, lazy module
    state), so that the timed pass measures the steady state the pipeline runs in. A heavy head
    is timed over fewer of the images (:func:`hapi_models.timed_samples`, from the warm-up's time or
    ``known_s``, the layers' known seconds per sample); all of them are decoded. Shared by the
    HAPI server and the Swift filter's in-proxy execution.
    """
    try:
        start = time.perf_counter()
        x = transform.decode_batch(images, max_pixels=max_pixels, names=names)
        decode = (time.perf_counter() - start) / len(images)
        x = x.to(device)
        layers = model.layers[:split]
        with torch.inference_mode():
            runs = folder.runs(layers, x) if folder is not None else [(1, m) for m in layers]
            per_sample = known_s
            if warm_up:
                # A sample warms the kernels and the allocator; a whole batch would
                # double what a first timing costs on a CPU. Timed, it says how heavy a sample
                # is (an overestimate: a first pass is slower).
                per_sample = hapi_models.warm_up_runs(
                    runs, x[: hapi_models.WARM_UP_SAMPLES], layouts=layouts, turn=turn
                )
            x = x[: hapi_models.timed_samples(per_sample, len(images))]
            n = len(x)
            labels = torch.zeros(n, dtype=torch.int64)
            encode: list[float] = []
            sizes: list[float] = []

            def encoded(y: torch.Tensor, count: int) -> None:
                # A folded pair's output stands for both layers' (a norm keeps its input's shape).
                start = time.perf_counter()
                frame = encoder.batch(y.to("cpu"), labels, offset=0)
                spent = (time.perf_counter() - start) / n
                encode.extend([spent] * count)
                sizes.extend([len(frame) / n] * count)

            times, _ = hapi_models.time_runs(runs, x, layouts=layouts, turn=turn, each=encoded)
    except NotImplementedError:
        raise
    except RuntimeError as exc:  # the same reading as the engine's: the device ran out
        raise BatchExecutionError(str(exc)) from exc
    return HeadMeasurement(decode, times, encode, sizes, n)


def time_head(
    model: hapi_models.SplittableModel,
    req: TimingsRequest,
    images: Sequence[ImageData],
    transform: hapi_models.InputTransform,
    device: torch.device,
    layer_times: LayerTimes,
    max_pixels: int,
    load: int,
    names: Sequence[str] | None = None,
    *,
    folder: hapi_models.BatchNormFolder | None = None,
    layouts: bool = False,
    turn: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> TimingsResponse:
    """Answer ``req`` from ``layer_times`` where earlier requests (anyone's) timed these
    layers on this device at this wire format often enough to settle (``SETTLE_MEASUREMENTS``):
    only the decode of ``images`` is timed, the model does not run. Else measure the head over
    ``images`` (a warm-up first when no layer time is known for this model and device) and keep
    it, answering the fastest times seen. Blocking: the HAPI server runs it in its executor, the
    Swift filter's in-proxy execution in its thread pool."""
    key: TimingKey = (req.model.arch, req.model.num_classes, transform.input_shape, str(device))
    dtype, compression = req.output_dtype.value, req.compression.value
    kept = layer_times.head(key, dtype, compression, req.split_index)
    if kept is not None:
        start = time.perf_counter()
        transform.decode_batch(images, max_pixels=max_pixels, names=names)
        decode = (time.perf_counter() - start) / len(images)
        head, samples = kept, len(images)
    else:
        known = layer_times.get(key, req.split_index)
        measured = measure_head(
            model,
            req.split_index,
            images,
            transform,
            device,
            FrameEncoder(dtype=req.output_dtype, compression=req.compression),
            max_pixels,
            warm_up=known is None,
            names=names,
            known_s=None if known is None else sum(known),
            folder=folder,
            layouts=layouts,
            turn=turn,
        )
        decode = measured.decode_s_per_sample
        head = layer_times.record(
            key,
            dtype,
            compression,
            measured.layer_s_per_sample,
            measured.encode_s_per_sample,
            measured.wire_bytes_per_sample,
        )
        samples = measured.samples
    return TimingsResponse(
        arch=req.model.arch,
        device=str(device),
        samples=samples,
        decode_s_per_sample=decode,
        layer_s_per_sample=head.layer_s,
        encode_s_per_sample=head.encode_s,
        wire_bytes_per_sample=head.wire_bytes,
        load=load,
        cached=kept is not None,
    )


def time_request(rt: CoreRuntime, req: TimingsRequest) -> Flow[TimingsResponse]:
    """Admit ``req`` as an extraction of its first ``samples`` images, and measure it."""
    prep = yield from prepare(rt, req.model_copy(update={"b_max": req.samples}))
    status = "200"
    timed = min(req.samples, prep.reservation.batch_size)
    try:
        answer: TimingsResponse = yield Compute(
            functools.partial(
                raising_server_errors,
                time_head,
                prep.model.model,
                req,
                prep.images[:timed],
                input_transform(req.transform),
                prep.scheduler.device.torch_device,
                rt.layer_times,
                rt.settings.max_image_pixels,
                max(0, prep.scheduler.load - 1),  # other requests waiting or running
                None if prep.names is None else prep.names[:timed],
                folder=rt.folder if rt.folder.enabled else None,
                layouts=rt.layouts.enabled,
                turn=turn_taker(
                    rt.turns,
                    cuda=prep.scheduler.device.is_cuda,
                    owner=prep.owner,
                    arrived=prep.started,
                    timeout_s=rt.settings.request_timeout_s,
                ),
            )
        )
    except BaseException:
        status = "error"
        raise
    finally:
        # ``finish`` counts the request under "extract"; a timing request is one too, as far as
        # memory and the request metrics go.
        finish(rt, prep, status)
    log.info(
        "%s: timed %s up to layer %d on %s over %d images (%s)",
        prep.request_id,
        req.model.arch,
        req.split_index,
        answer.device,
        answer.samples,
        "answered from the kept timings" if answer.cached else "the head measured",
    )
    return answer
