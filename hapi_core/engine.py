"""The compute of one request, run in a worker thread: decode, transform, head forward, encode.

Frames are handed to ``emit`` as each COS batch finishes, so the client starts receiving while
the server still computes. ``emit`` blocks when the client reads slowly (back-pressure) and the
job stops between batches once ``cancelled`` is set (client gone, server shutting down).

The steps overlap (issue 30): while the job's thread runs the head over COS batch k and
encodes its frame, the host's :class:`~hapi_core.decode_pool.DecodePool` decodes batch k + 1,
one task per image, in the order requests submit them. A job that stops (cancelled, failed,
or its generator closed) drops its queued decode tasks and waits for its running ones, so it
leaves nothing running behind it.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
import traceback
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field

import hapi_models
import torch

from hapi_contract import ImageData
from hapi_contract.frames import FrameEncoder

from .decode_pool import DecodePool, DecodeTask
from .devices import Device
from .forward_turns import ForwardTurns, turn_taker
from .host_memory import HOST_MEMORY, HostMemoryProbe
from .roofline import RooflineMeter

log = logging.getLogger(__name__)


class JobCancelled(Exception):
    """The job stopped early because its client went away."""


class BatchExecutionError(RuntimeError):
    """torch failed on a batch that every check accepted: the device could not run it.

    torch 2.14 reports a failed CPU allocation as a bare ``RuntimeError`` (``[enforce fail at
    alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory``), no subclass, unlike CUDA's
    ``torch.OutOfMemoryError``. By the time a batch runs, the architecture and input size have
    passed the meta-device profile (shape errors are a 422 before the stream), the weights have
    loaded and every image has decoded (a bad one is ``ImageDecodeError``), so a RuntimeError
    from the batch's tensor work is the device running out, in practice of memory. The engine
    raises this type there, so that the status is chosen by type (507), not by message.
    """


@dataclass
class JobStats:
    cos_batch_sizes: list[int] = field(default_factory=list)
    decode_s: float = 0.0
    """Time the job waited for its decode (what the overlap did not hide) and normalised."""
    decode_cpu_s: float = 0.0
    """The decode's thread CPU seconds, wherever it ran (the roofline's decode stage)."""
    normalize_s: float = 0.0
    """Of ``decode_s``: the uint8 batch's normalisation, on torch's threads."""
    compute_s: float = 0.0
    encode_s: float = 0.0
    turns_s: float = 0.0
    """Time its forward passes waited for a turn at the CPU's cores (other requests' ran)."""
    feature_bytes: int = 0
    peak_bytes_per_sample: float | None = None
    """Measured peak memory per sample (CUDA: every batch; CPU: one lone batch, see
    :class:`~hapi_core.host_memory.HostMemoryProbe`); None when nothing was measured."""
    vmhwm_resets: int = 0
    """Batches during which the probe reset the process's ``VmHWM`` (a benchmark reading it
    from outside must know: see :class:`~hapi_core.host_memory.HostMemoryProbe`)."""
    started: float = field(default_factory=time.perf_counter)
    """When the job began (``perf_counter``): its achieved images/s count from here."""

    def as_meta(self, total_s: float, queued_s: float) -> dict[str, object]:
        return {
            "cos_batch_sizes": self.cos_batch_sizes,
            "server_ms": {
                "total": round(total_s * 1000, 3),
                "queued": round(queued_s * 1000, 3),
                "decode": round(self.decode_s * 1000, 3),
                "compute": round(self.compute_s * 1000, 3),
                "encode": round(self.encode_s * 1000, 3),
                "turns": round(self.turns_s * 1000, 3),
            },
            "feature_bytes": self.feature_bytes,
            "vmhwm_resets": self.vmhwm_resets,
        }


@dataclass
class ExtractionJob:
    model: hapi_models.SplittableModel
    split: int
    images: Sequence[ImageData]
    labels: Sequence[int]
    transform: hapi_models.InputTransform
    batch_size: int
    device: Device
    max_pixels: int
    encoder: FrameEncoder
    host_memory: HostMemoryProbe = field(default_factory=lambda: HOST_MEMORY)
    """Measures a CPU batch of a request that runs alone (the schedulers' probe)."""
    names: Sequence[str] | None = None
    """Where each image came from (its object, or its shard and key), for the decode's errors."""
    decode_pool: DecodePool | None = None
    """The host's decode threads (None: the job's own thread decodes, with no overlap)."""
    decode_path: hapi_models.DecodePath = "fast"
    layouts: hapi_models.LayoutChooser | None = None
    """The host's layout choices (None: the head runs on a contiguous input)."""
    folder: hapi_models.BatchNormFolder | None = None
    """The host's heads with their batch norms folded (None: the layers as built)."""
    decode_timeout_s: float = 600.0
    """Longest wait for one image's decode (a bound, never reached by a healthy pool)."""
    token: object = field(default_factory=object)
    """This job's tasks in the decode pool's counts (:meth:`DecodePool.pending`)."""
    request_id: str = ""
    """The request it computes, for /metrics' series of running requests."""
    roofline: RooflineMeter | None = None
    """Where the job reports its ratio to the host's roofline (None: nowhere)."""
    turns: ForwardTurns | None = None
    """The CPU host's turns for forward passes (None, or a GPU: the forward runs at once)."""
    owner: str = ""
    """Whose turn the job's forward passes take (the caller's account)."""
    arrived: float = 0.0
    """When its request arrived (``time.perf_counter``): an owner's oldest goes first."""


_INLINE = DecodePool(0)


@dataclass
class _Decoding:
    """The decode of samples ``[start, stop)`` in flight: uint8 crops, or (PIL path) a batch."""

    start: int
    stop: int
    tasks: list[DecodeTask[object]]
    crops: torch.Tensor | None
    cpu_s: list[float]
    """Each task's thread CPU seconds, written as it ends."""


def _cpu_timed(fn: Callable[[], object], cpu_s: list[float], slot: int) -> Callable[[], object]:
    def run() -> object:
        started = time.thread_time()
        try:
            return fn()
        finally:
            cpu_s[slot] = time.thread_time() - started

    return run


def _submit_decode(job: ExtractionJob, pool: DecodePool, token: object, start: int) -> _Decoding:
    stop = min(len(job.images), start + job.batch_size)
    names = job.names
    transform, limit = job.transform, job.max_pixels
    if job.decode_path == "pil":
        # The previous server, kept for the roofline's comparison: the batch as one task.
        batch_names = None if names is None else names[start:stop]
        cpu_s = [0.0]
        task = pool.submit(
            token,
            _cpu_timed(
                lambda: transform.decode_batch(
                    job.images[start:stop], max_pixels=limit, names=batch_names, path="pil"
                ),
                cpu_s,
                0,
            ),
        )
        return _Decoding(start, stop, [task], None, cpu_s)
    if job.device.is_cuda:
        # nvJPEG takes the batch in one call; the pool's thread waits on the GPU meanwhile.
        device, batch_names = job.device.torch_device, None if names is None else names[start:stop]
        cpu_s = [0.0]
        task = pool.submit(
            token,
            _cpu_timed(
                lambda: transform.decode_batch_cuda(
                    job.images[start:stop], device, max_pixels=limit, names=batch_names
                ),
                cpu_s,
                0,
            ),
        )
        return _Decoding(start, stop, [task], None, cpu_s)
    try:
        crops = torch.empty((stop - start, *transform.input_shape), dtype=torch.uint8)
    except RuntimeError as exc:  # the host is out of memory, as in a batch's own tensor work
        raise BatchExecutionError(str(exc)) from exc

    def decode_one(i: int) -> object:
        with hapi_models.named_errors(names, i):
            crops[i - start] = transform.decode_uint8(job.images[i], max_pixels=limit)
        return None

    cpu_s = [0.0] * (stop - start)
    tasks = [
        pool.submit(token, _cpu_timed(functools.partial(decode_one, i), cpu_s, i - start))
        for i in range(start, stop)
    ]
    return _Decoding(start, stop, tasks, crops, cpu_s)


def _wait_decoded(job: ExtractionJob, decoding: _Decoding) -> torch.Tensor:
    """The batch's decode, waited for; its first failing image raises (named)."""
    results = [task.result(job.decode_timeout_s) for task in decoding.tasks]
    if decoding.crops is not None:
        return decoding.crops
    assert isinstance(results[0], torch.Tensor)
    return results[0]


def iter_frames(job: ExtractionJob, stats: JobStats) -> Generator[bytes, None, None]:
    """The job's frames, one COS batch per step, with its memory measured into ``stats``.

    Each step is blocking compute: the HAPI server runs the whole loop in a worker thread
    (:func:`run_extraction`), the Swift filter each step in the proxy's thread pool. The
    decode of the next batch is in the pool while a step runs and after it yields.
    """
    device = job.device.torch_device
    key = (job.model.arch, job.split, tuple(job.transform.input_shape))
    step: _Step | None = None
    sample_bytes = 4 * math.prod(job.transform.input_shape)  # the float32 input batch
    pool = job.decode_pool or _INLINE
    token = job.token
    stats.started = time.perf_counter()
    # The head on a CPU shares the cores with the decode: the roofline adds their CPU seconds.
    on_cores = not job.device.is_cuda
    starts = range(0, len(job.images), job.batch_size)
    pending = _submit_decode(job, pool, token, 0) if len(starts) else None
    current: _Decoding | None = None
    try:
        for start in starts:
            assert pending is not None and pending.start == start
            current, pending = pending, None
            done = current.stop - start
            t0 = time.perf_counter()
            try:
                decoded = _wait_decoded(job, current)
            except NotImplementedError:
                raise
            except RuntimeError as exc:
                raise BatchExecutionError(str(exc)) from exc
            stats.decode_s += time.perf_counter() - t0
            stats.decode_cpu_s += sum(current.cpu_s)
            if step is None:
                # Before the memory is measured: the folds' probe and copies are the host's,
                # made once, and the measuring hooks go on the layers that run.
                step = _Step(
                    _head(job, decoded),
                    job.transform,
                    job.labels,
                    job.encoder,
                    job.batch_size,
                    device,
                    job.layouts,
                    (*key, str(device)),
                    turn_taker(
                        job.turns,
                        cuda=job.device.is_cuda,
                        owner=job.owner,
                        arrived=job.arrived,
                        timeout_s=job.decode_timeout_s,
                    ),
                )
            if job.device.is_cuda:
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            # One host reading per request at most: the estimator counts readings per request.
            measured = stats.peak_bytes_per_sample is not None
            probe_samples = 0 if job.device.is_cuda or measured else done
            with ExitStack() as stack:
                reading = stack.enter_context(
                    job.host_memory.measure(key, probe_samples, done * sample_bytes, step.head)
                )
                # Inside the measured window: the next batch's decode buffers coexist with
                # this batch's forward pass, and the planner's correction must see them.
                if current.stop < len(job.images):
                    pending = _submit_decode(job, pool, token, current.stop)
                frame = step(decoded, start, stats)
            if job.device.is_cuda:
                peak = (torch.cuda.max_memory_allocated(device) - base) / done
                stats.peak_bytes_per_sample = max(stats.peak_bytes_per_sample or 0.0, peak)
            else:
                stats.vmhwm_resets += reading.reset
                if reading.bytes_per_sample is not None:
                    stats.peak_bytes_per_sample = reading.bytes_per_sample
            if job.roofline is not None:
                job.roofline.observe(job.device.name, job.request_id, stats, on_cores)
            yield frame
    except BaseException as exc:
        # The frames below this one have ended: their batches go now, whoever keeps the error.
        _release_frames(exc)
        raise
    finally:
        # The batch in hand too: one image failed, the others may still be queued or running.
        left = [t for d in (current, pending) if d is not None for t in d.tasks]
        pool.cancel(token, left, job.decode_timeout_s)
        if job.roofline is not None:
            job.roofline.finish(job.device.name, job.request_id, stats, on_cores)


def _head(job: ExtractionJob, decoded: torch.Tensor) -> torch.nn.Module:
    """The job's head as it runs: its layers with their batch norms folded where the host
    folds them (the first samples of ``decoded``, the job's first batch, make missing folds)."""
    if job.folder is None or not job.folder.enabled:
        return job.model.head(job.split)
    probe = decoded[:1].to(job.device.torch_device)
    if probe.dtype == torch.uint8:
        probe = job.transform.normalize(probe)
    with torch.inference_mode():
        return job.folder.layers(job.model.layers[: job.split], probe)


@dataclass(frozen=True)
class _Step:
    """What turns a decoded batch into a frame: the same for every batch of a job."""

    head: torch.nn.Module
    transform: hapi_models.InputTransform
    labels: Sequence[int]
    encoder: FrameEncoder
    batch_size: int
    device: torch.device
    layouts: hapi_models.LayoutChooser | None
    layout_key: tuple[object, ...]
    turn: Callable[[], AbstractContextManager[None]] = nullcontext
    """Held while the batch is normalised and run (:func:`~hapi_core.forward_turns.turn_taker`)."""

    def __call__(self, decoded: torch.Tensor, start: int, stats: JobStats) -> bytes:
        """Normalise, run the head over, and encode one decoded batch."""
        done = len(decoded)
        try:
            waited = time.perf_counter()
            with self.turn():
                t0 = time.perf_counter()
                x = decoded.to(self.device, non_blocking=True)
                if x.dtype == torch.uint8:
                    x = self.transform.normalize(x)
                t1 = time.perf_counter()
                with torch.inference_mode():
                    if self.layouts is None:
                        y = self.head(x)
                    else:
                        y = self.layouts.forward(self.layout_key, self.head, x)
                    y = y.to("cpu").contiguous()
                t2 = time.perf_counter()
            label_t = torch.tensor(list(self.labels[start : start + done]), dtype=torch.int64)
            frame = self.encoder.batch(
                y, label_t, offset=start, meta={"cos_batch_size": self.batch_size}
            )
            t3 = time.perf_counter()
        except NotImplementedError:
            raise  # an operator the device lacks: a fault of ours, not of the device's capacity
        except RuntimeError as exc:
            raise BatchExecutionError(str(exc)) from exc
        stats.turns_s += t0 - waited
        stats.decode_s += t1 - t0
        stats.normalize_s += t1 - t0
        stats.compute_s += t2 - t1
        stats.encode_s += t3 - t2
        stats.cos_batch_sizes.append(done)
        stats.feature_bytes += len(frame)
        return frame


def run_batch(
    head: torch.nn.Module,
    transform: hapi_models.InputTransform,
    images: Sequence[ImageData],
    labels: Sequence[int],
    start: int,
    batch_size: int,
    device: torch.device,
    encoder: FrameEncoder,
    max_pixels: int,
    stats: JobStats,
    names: Sequence[str] | None = None,
    *,
    decode_path: hapi_models.DecodePath = "fast",
) -> bytes:
    """Decode, run the head over, and encode samples ``[start, start + batch_size)`` in the
    caller's thread, with no overlap (one batch alone; :func:`iter_frames` pipelines a job).

    An image that does not decode is an ``ImageDecodeError`` led by its entry in ``names``.
    """
    stop = min(len(images), start + batch_size)
    t0 = time.perf_counter()
    try:
        x = transform.decode_batch(
            images[start:stop],
            max_pixels=max_pixels,
            names=None if names is None else names[start:stop],
            path=decode_path,
        )
    except NotImplementedError:
        raise
    except RuntimeError as exc:
        raise BatchExecutionError(str(exc)) from exc
    stats.decode_s += time.perf_counter() - t0
    step = _Step(head, transform, labels, encoder, batch_size, device, None, ())
    return step(x, start, stats)


def run_extraction(
    job: ExtractionJob, emit: Callable[[bytes], None], cancelled: threading.Event
) -> JobStats:
    """Run ``job``, handing each frame to ``emit``; stop between batches once ``cancelled``.

    However it stops, the job's queued decode tasks are dropped and its running ones waited
    for before this returns or raises.
    """
    stats = JobStats()
    frames = iter_frames(job, stats)
    try:
        while not cancelled.is_set():
            frame = next(frames, None)
            if frame is None:
                return stats
            emit(frame)
        raise JobCancelled()
    except BaseException as exc:
        _release_frames(exc)  # iter_frames' own frame, ended now (see there)
        raise
    finally:
        frames.close()


def _release_frames(exc: BaseException) -> None:
    """Clear the local variables of every frame that ``exc``, its cause and its context passed
    through, but of those still running: a failed batch's tensors are such locals (the input in
    :class:`_Step`, the activations in the model's ``forward`` frames, the decoded batch in
    :func:`iter_frames`), and an exception that is kept keeps its frames. A host hands the
    error on as a value (the server's worker thread, eventlet's tpool), and there it sits in a
    reference cycle (a frame that outlives its call holds its caller's frame, whose locals hold
    the error), which only a full garbage collection frees: a server whose memory ran out kept
    200 MiB of failed batches after their error frames, and refused requests that fit.
    The tracebacks still tell where it failed: only the locals go."""
    seen: set[int] = set()
    chain: list[BaseException] = [exc]
    while chain:
        err = chain.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        chain.extend(e for e in (err.__cause__, err.__context__) if e is not None)
