"""The one settings object of the HAPI server (environment variables ``HAPI_*``)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024
GiB = 1024 * MiB


class ServerSettings(BaseSettings):
    """Every limit is a setting; ``HAPI_<NAME>`` overrides it (e.g. ``HAPI_PORT=9000``)."""

    model_config = SettingsConfigDict(env_prefix="HAPI_", env_file=".env", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8090, ge=1, le=65535, description="port to listen on")
    swift_url: str = Field(
        "http://127.0.0.1:8080",
        description="base URL of the Swift proxy; a caller's storage URL must live under it",
    )
    swift_timeout_s: float = Field(60.0, gt=0, description="timeout of each request to Swift")
    swift_read_concurrency: int = Field(
        8, ge=1, le=1024, description="most Swift reads one request has in flight at once"
    )

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
    framework_reserve_bytes: int = Field(
        256 * MiB, ge=0, description="memory per device never planned (framework, allocator)"
    )
    max_concurrent_per_device: int = Field(
        8, ge=1, description="worker threads per device (image checks, decode and compute)"
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads; default: torch's own choice"
    )
    allow_tf32: bool = Field(
        False,
        description="let a GPU run float32 convolutions and matmuls in TF32 (faster, ~1e-3 "
        "relative error): off, a float32 request gets float32 features that the client's own "
        "layers reproduce to float32 rounding",
    )

    # Limits.
    max_request_body_bytes: int = Field(
        1 * MiB, ge=1024, description="largest request body (413), chunked or not"
    )
    max_object_bytes: int = Field(1 * GiB, ge=1024, description="largest shard object (413)")
    max_weights_bytes: int = Field(2 * GiB, ge=1024, description="largest weights object (413)")
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="largest image, width x height (413)"
    )
    max_samples_per_request: int = Field(
        10_000, ge=1, description="most samples in one shard (413)"
    )
    queue_limit: int = Field(256, ge=1, description="waiting requests per device before 503")
    request_timeout_s: float = Field(600.0, gt=0, description="longest wait for memory before 504")
    retry_after_s: int = Field(2, ge=1, description="Retry-After of a 503 (queue full)")
    weights_cache_bytes: int = Field(2 * GiB, ge=0, description="idle weights kept loaded")

    # ALL_IN_COS fine-tuning.
    max_finetune_epochs: int = Field(50, ge=1, description="most epochs of one /v1/finetune")


@lru_cache
def get_settings() -> ServerSettings:
    return ServerSettings()
