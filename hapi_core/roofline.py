"""The roofline of an extraction host, and how near each running request comes to it.

A host turns images into features with two stages that share its cores: the decode and the
head (issue 30). Its ceiling is what the cores can do when neither ever waits for the other:
the cores over the CPU seconds one image needs, decode plus head (on a CPU both run on the
same cores), bounded by the Swift read when one is measured (or, where Swift runs on the same
cores, with the read's seconds added: a request reads its shard before it computes). With the head on a GPU only the
decode is on the cores, and the ceiling is the slower of the two stages instead.

One definition serves two readers:

* ``hapi bench roofline`` (``benchmarks/scenario_roofline.py``) measures the stages alone, one
  thread on one of the server's cores, and the Swift read of the shard;
* ``/metrics`` (:class:`RooflineMeter`) takes a running request's own stage times: the decode
  tasks' thread CPU seconds, and the head's wall seconds times torch's intra-op threads (with
  the input's normalisation, which runs on those threads too). Cheap (a clock read per image),
  and it says how well the request overlaps its stages on the cores, not how fast the stages
  are: a loaded host slows both the request and its ceiling. The shard is read whole before the
  compute starts, so the read is no bound there, and the achieved rate counts the compute only
  (from the request's first decode to its last frame).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING

import torch

from .metrics import Metrics

if TYPE_CHECKING:
    from .engine import JobStats

__all__ = ["RooflineMeter", "roofline_images_per_s"]


def roofline_images_per_s(
    cores: int,
    decode_s: float,
    head_s: float,
    *,
    head_on_cores: bool = True,
    read_images_per_s: float | None = None,
    read_on_cores: bool = False,
) -> float:
    """The most images/s ``cores`` can give, from the seconds per image of one thread's decode
    (``decode_s``) and of the head (``head_s``: CPU seconds on the cores, or the device's
    seconds when ``head_on_cores`` is false), bounded by ``read_images_per_s`` when given.

    ``read_on_cores``: Swift runs on the same cores (a one-host stack), so its read takes their
    time too: its seconds per image add to the compute's rather than bounding it apart."""
    if head_on_cores:
        ceiling = cores / (decode_s + head_s) if decode_s + head_s > 0 else math.inf
    else:
        decode = cores / decode_s if decode_s > 0 else math.inf
        ceiling = min(decode, 1 / head_s if head_s > 0 else math.inf)
    if read_images_per_s is None:
        return ceiling
    if read_on_cores:
        return 1 / (1 / ceiling + 1 / read_images_per_s)
    return min(ceiling, read_images_per_s)


class RooflineMeter:
    """Exports, per running extraction, its achieved images/s over its roofline
    (``hapi_roofline_ratio``), and the last finished one's per device."""

    def __init__(self, metrics: Metrics, cores: int) -> None:
        self.metrics = metrics
        self.cores = cores
        self._lock = threading.Lock()
        self._running: set[tuple[str, str]] = set()

    def ratio(self, stats: JobStats, on_cores: bool) -> float | None:
        """The job's achieved images/s over its roofline so far; None before a batch is done
        (or with stage times too small to read)."""
        images = sum(stats.cos_batch_sizes)
        elapsed = time.perf_counter() - stats.started
        head_wall = stats.normalize_s + stats.compute_s
        if images == 0 or elapsed <= 0 or stats.decode_cpu_s + head_wall <= 0:
            return None
        # torch's intra-op threads all work through a CPU head's forward: its CPU seconds.
        head = head_wall * torch.get_num_threads() if on_cores else head_wall
        ceiling = roofline_images_per_s(
            self.cores, stats.decode_cpu_s / images, head / images, head_on_cores=on_cores
        )
        ratio = images / elapsed / ceiling
        return ratio if math.isfinite(ratio) and ratio > 0 else None

    def observe(self, device: str, request: str, stats: JobStats, on_cores: bool) -> None:
        """After each batch of a running job."""
        ratio = self.ratio(stats, on_cores)
        if ratio is None:
            return
        with self._lock:
            self._running.add((device, request))
            self.metrics.roofline_ratio.labels(device, request).set(ratio)

    def finish(self, device: str, request: str, stats: JobStats, on_cores: bool) -> None:
        """When the job stops, however: its series goes, its final ratio becomes the last."""
        ratio = self.ratio(stats, on_cores)
        with self._lock:
            if (device, request) in self._running:
                self._running.discard((device, request))
                self.metrics.roofline_ratio.remove(device, request)
            if ratio is not None:
                self.metrics.roofline_ratio_last.labels(device).set(ratio)
