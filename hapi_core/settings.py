"""The settings of the extraction core: batch adaptation, devices and every input limit.

The HAPI server reads them from its environment (``HAPI_*``, see
:class:`hapi_server.ServerSettings`, which extends this class); the Swift filter's in-proxy
execution builds them from its ``[filter:hapi]`` options. One declaration, so both executions
plan and refuse alike.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["GiB", "MiB", "CoreSettings"]

MiB = 1024 * 1024
GiB = 1024 * MiB


class CoreSettings(BaseModel):
    """What an extraction may use and how its COS batch is planned (thesis §5.4.5)."""

    # Batch adaptation (thesis 5.4.5).
    adaptation: bool = Field(True, description="off: every request runs at its b_max, unchecked")
    b_min: int = Field(25, ge=1, description="smallest COS batch the adaptation hands out")
    adaptation_window_s: float = Field(
        0.005, ge=0, le=1, description="how long a round waits to gather requests arriving together"
    )
    devices: str | None = Field(
        None, description="e.g. 'cpu' or 'cuda:0,cuda:1'; default: all GPUs, else cpu"
    )
    cpu_memory_budget_bytes: int = Field(
        4 * GiB, ge=16 * MiB, description="M_total of the cpu device (a GPU's comes from NVML)"
    )
    gpu_memory_limit_bytes: int | None = Field(
        None, description="cap a GPU's usable memory (testing)"
    )
    count_process_memory: bool = Field(
        True,
        description="on a CPU, count the process's resident memory beyond the reserve, the "
        "planned requests and the resident weights as occupied (off: plan the budget alone)",
    )
    memory_sample_interval_s: float = Field(
        0.01, gt=0, le=10, description="how often the process's resident memory is sampled"
    )
    framework_reserve_bytes: int = Field(
        256 * MiB, ge=0, description="memory per device never planned (framework, allocator)"
    )
    max_concurrent_per_device: int = Field(
        8, ge=1, description="worker threads per device (image checks, decode and compute)"
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads; default: the cores decode leaves"
    )
    cpu_forwards_at_once: int | None = Field(
        None,
        ge=1,
        description="head forward passes a CPU device runs at once, the others waiting their "
        "turn (the least recently served caller's oldest request next); default: the cores "
        "over torch's threads (1 when torch has them all: more only time-slice the cores)",
    )
    cores: int | None = Field(
        None,
        ge=1,
        description="cores the decode threads and torch's intra-op threads share (their sum "
        "never exceeds it); default: the cores this process may run on (its affinity)",
    )
    decode_threads: int | None = Field(
        None,
        ge=0,
        description="threads that decode the next COS batch of every request while the head "
        "runs (one FIFO pool); default: all cores but one with a GPU, one per 8 cores on a CPU "
        "(the head needs them); 0: each request decodes in its own thread, with no overlap",
    )
    decode_path: Literal["fast", "pil"] = Field(
        "fast",
        description="fast: libjpeg-turbo into uint8 and batched normalisation; pil: the "
        "previous PIL path (for the roofline benchmark's comparison)",
    )
    channels_last: bool = Field(
        True,
        description="run each head on a channels_last input where that measured faster "
        "(once per architecture, split, input shape and device)",
    )
    fold_batch_norms: bool = Field(
        True,
        description="fold each batch norm that follows a convolution into it, in the heads "
        "this host runs (once per layer; features equal to float rounding)",
    )
    allow_tf32: bool = Field(
        False,
        description="let a GPU run float32 convolutions and matmuls in TF32 (faster, ~1e-3 "
        "relative error): off, a float32 request gets float32 features that the client's own "
        "layers reproduce to float32 rounding",
    )

    # Limits.
    max_object_bytes: int = Field(1 * GiB, ge=1024, description="largest shard object (413)")
    max_weights_bytes: int = Field(2 * GiB, ge=1024, description="largest weights object (413)")
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="largest image, width x height (413)"
    )
    max_samples_per_request: int = Field(
        10_000, ge=1, description="most samples in one shard (413)"
    )
    max_image_bytes: int = Field(
        16 * MiB, ge=1024, description="largest image object or tar member, in place (413/422)"
    )
    object_read_concurrency: int = Field(
        16,
        ge=1,
        le=1024,
        description="image objects of a folder dataset's part one request reads at once",
    )
    queue_limit: int = Field(256, ge=1, description="waiting requests per device before 503")
    request_timeout_s: float = Field(600.0, gt=0, description="longest wait for memory before 504")
    retry_after_s: int = Field(2, ge=1, description="Retry-After of a 503 (queue full)")
    weights_cache_bytes: int = Field(2 * GiB, ge=0, description="idle weights kept loaded")

    # One extraction for many jobs (hapi_core.shared_features).
    feature_store_bytes: int = Field(
        256 * MiB,
        ge=0,
        description="computed features kept for other requests of the same shard, weights, "
        "split, transform and dtype (least recently used evicted), and the most that "
        "computations in flight copy for them; 0: no store and no coalescing of concurrent "
        "identical requests",
    )
    feature_store_dir: str | None = Field(
        None,
        description="keep the store's features as files in this directory instead of memory; "
        "one that cannot be written turns the store off (logged once)",
    )
