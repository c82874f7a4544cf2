"""The compute of one request, run in a worker thread: decode, transform, head forward, encode.

Frames are handed to ``emit`` as each COS batch finishes, so the client starts receiving while
the server still computes. ``emit`` blocks when the client reads slowly (back-pressure) and the
job stops between batches once ``cancelled`` is set (client gone, server shutting down).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import hapi_models
import torch

from hapi_contract.frames import FrameEncoder

from .devices import HOST_MEMORY, Device, HostMemoryProbe

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
    compute_s: float = 0.0
    encode_s: float = 0.0
    feature_bytes: int = 0
    peak_bytes_per_sample: float | None = None
    """Measured peak memory per sample (CUDA: every batch; CPU: one lone batch, see
    :class:`~hapi_core.devices.HostMemoryProbe`); None when nothing was measured."""
    vmhwm_resets: int = 0
    """Batches during which the probe reset the process's ``VmHWM`` (a benchmark reading it
    from outside must know: see :class:`~hapi_core.devices.HostMemoryProbe`)."""

    def as_meta(self, total_s: float, queued_s: float) -> dict[str, object]:
        return {
            "cos_batch_sizes": self.cos_batch_sizes,
            "server_ms": {
                "total": round(total_s * 1000, 3),
                "queued": round(queued_s * 1000, 3),
                "decode": round(self.decode_s * 1000, 3),
                "compute": round(self.compute_s * 1000, 3),
                "encode": round(self.encode_s * 1000, 3),
            },
            "feature_bytes": self.feature_bytes,
            "vmhwm_resets": self.vmhwm_resets,
        }


@dataclass
class ExtractionJob:
    model: hapi_models.SplittableModel
    split: int
    images: Sequence[bytes]
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


def run_batch(
    head: torch.nn.Module,
    transform: hapi_models.InputTransform,
    images: Sequence[bytes],
    labels: Sequence[int],
    start: int,
    batch_size: int,
    device: torch.device,
    encoder: FrameEncoder,
    max_pixels: int,
    stats: JobStats,
    names: Sequence[str] | None = None,
) -> bytes:
    """Decode, run the head over, and encode samples ``[start, start + batch_size)``.

    The one per-batch step of both the HAPI server and the proxy filter's in-proxy execution.
    An image that does not decode is an ``ImageDecodeError`` led by its entry in ``names``.
    """
    stop = min(len(images), start + batch_size)
    try:
        t0 = time.perf_counter()
        x = transform.decode_batch(
            images[start:stop],
            max_pixels=max_pixels,
            names=None if names is None else names[start:stop],
        )
        t1 = time.perf_counter()
        with torch.inference_mode():
            y = head(x.to(device, non_blocking=True)).to("cpu")
        t2 = time.perf_counter()
        label_t = torch.tensor(list(labels[start:stop]), dtype=torch.int64)
        frame = encoder.batch(y, label_t, offset=start, meta={"cos_batch_size": batch_size})
        t3 = time.perf_counter()
    except NotImplementedError:
        raise  # an operator the device lacks: a fault of ours, not of the device's capacity
    except RuntimeError as exc:
        raise BatchExecutionError(str(exc)) from exc
    stats.decode_s += t1 - t0
    stats.compute_s += t2 - t1
    stats.encode_s += t3 - t2
    stats.cos_batch_sizes.append(stop - start)
    stats.feature_bytes += len(frame)
    return frame


def iter_frames(job: ExtractionJob, stats: JobStats) -> Iterator[bytes]:
    """The job's frames, one COS batch per step, with its memory measured into ``stats``.

    Each step is blocking compute: the HAPI server runs the whole loop in a worker thread
    (:func:`run_extraction`), the Swift filter each step in the proxy's thread pool.
    """
    head = job.model.head(job.split)
    device = job.device.torch_device
    key = (job.model.arch, job.split, tuple(job.transform.input_shape))
    sample_bytes = 4 * math.prod(job.transform.input_shape)  # the float32 input batch
    for start in range(0, len(job.images), job.batch_size):
        done = min(len(job.images), start + job.batch_size) - start
        if job.device.is_cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        # One host reading per request at most: the estimator counts readings per request.
        measured = stats.peak_bytes_per_sample is not None
        probe_samples = 0 if job.device.is_cuda or measured else done
        with job.host_memory.measure(key, probe_samples, done * sample_bytes, head) as reading:
            frame = run_batch(
                head,
                job.transform,
                job.images,
                job.labels,
                start,
                job.batch_size,
                device,
                job.encoder,
                job.max_pixels,
                stats,
                job.names,
            )
        if job.device.is_cuda:
            peak = (torch.cuda.max_memory_allocated(device) - base) / done
            stats.peak_bytes_per_sample = max(stats.peak_bytes_per_sample or 0.0, peak)
        else:
            stats.vmhwm_resets += reading.reset
            if reading.bytes_per_sample is not None:
                stats.peak_bytes_per_sample = reading.bytes_per_sample
        yield frame


def run_extraction(
    job: ExtractionJob, emit: Callable[[bytes], None], cancelled: threading.Event
) -> JobStats:
    """Run ``job``, handing each frame to ``emit``; stop between batches once ``cancelled``."""
    stats = JobStats()
    frames = iter_frames(job, stats)
    while not cancelled.is_set():
        frame = next(frames, None)
        if frame is None:
            return stats
        emit(frame)
    raise JobCancelled()
