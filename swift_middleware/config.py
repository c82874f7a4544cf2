"""The options of the ``[filter:hapi]`` section, parsed and checked once at proxy start."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hapi_core.settings import CoreSettings, GiB, MiB
from swift_middleware.errors import FilterConfigError

__all__ = ["Execution", "FilterConfig"]

# Options every Swift filter section may carry that are not ours (paste wiring and logging).
_FOREIGN_OPTION = re.compile(r"^(use|paste\.filter_factory|log_\w+|set \S+|__\w+__|here)$")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class Execution(StrEnum):
    """Where the extraction runs."""

    DECOUPLED = "decoupled"
    """Forward to a separate HAPI server (the default: the proxy stays a light router)."""
    IN_PROXY = "in_proxy"
    """Run the model inside the proxy process, in its thread pool (thesis' first prototype)."""


def _split_list(value: object) -> object:
    if isinstance(value, str):
        return [item for item in re.split(r"[\s,]+", value) if item]
    return value


class FilterConfig(BaseModel):
    """Options of the filter (names as in ``proxy-server.conf``; times in seconds).

    Build it with :meth:`from_conf`, which accepts the strings paste hands over.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    execution: Execution = Execution.DECOUPLED
    hapi_servers: list[str] = Field(default_factory=list)
    swift_url: str | None = None
    max_body_bytes: Annotated[int, Field(ge=1024, le=64 * MiB)] = 1 * MiB
    health_check_interval: Annotated[float, Field(ge=0, le=3600)] = 5.0
    health_timeout: Annotated[float, Field(gt=0, le=60)] = 2.0
    conn_timeout: Annotated[float, Field(gt=0, le=600)] = 5.0
    node_timeout: Annotated[float, Field(gt=0, le=86400)] = 600.0
    retry_after: Annotated[int, Field(ge=1, le=3600)] = 5
    # In-proxy execution only (see :meth:`core_settings`).
    device: str = "auto"
    torch_threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    max_concurrent: Annotated[int, Field(ge=1, le=1024)] = 2
    memory_budget_bytes: Annotated[int, Field(ge=16 * MiB)] = 2 * GiB
    framework_reserve_bytes: Annotated[int, Field(ge=0)] = 256 * MiB
    # On a CPU, the proxy's resident memory beyond the planned requests counts as occupied:
    # what earlier requests left behind (the proxy's own, malloc's) is not the budget's to give.
    count_process_memory: bool = True
    gpu_memory_limit_bytes: Annotated[int, Field(ge=16 * MiB)] | None = None
    b_min: Annotated[int, Field(ge=1)] = 25
    queue_limit: Annotated[int, Field(ge=1)] = 64
    request_timeout: Annotated[float, Field(gt=0)] = 600.0
    # A client that takes no frame of its stream for this long is cut off: its slot and memory
    # are freed instead of waiting on a reader that may never come back.
    send_timeout: Annotated[float, Field(gt=0, le=86400)] = 60.0
    weights_cache_bytes: Annotated[int, Field(ge=0)] = 1 * GiB
    # Features computed once for identical in-proxy requests (hapi_core.shared_features).
    feature_store_bytes: Annotated[int, Field(ge=0)] = 0
    max_object_bytes: Annotated[int, Field(ge=1024)] = 1 * GiB
    max_weights_bytes: Annotated[int, Field(ge=1024)] = 2 * GiB
    max_image_pixels: Annotated[int, Field(ge=1)] = 40_000_000
    max_samples_per_request: Annotated[int, Field(ge=1)] = 10_000
    max_image_bytes: Annotated[int, Field(ge=1024)] = 16 * MiB
    object_read_concurrency: Annotated[int, Field(ge=1, le=1024)] = 16

    @field_validator("hapi_servers", mode="before")
    @classmethod
    def _servers_list(cls, value: object) -> object:
        return _split_list(value)

    @field_validator("hapi_servers")
    @classmethod
    def _servers_are_base_urls(cls, value: list[str]) -> list[str]:
        out = []
        for url in value:
            out.append(_base_url(url, "hapi_servers"))
        if len(set(out)) != len(out):
            raise ValueError("hapi_servers names the same server twice")
        return out

    @field_validator("swift_url")
    @classmethod
    def _swift_url_is_base(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        return _base_url(value, "swift_url")

    @field_validator("torch_threads", "gpu_memory_limit_bytes", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {value!r}")
        return value

    def core_settings(self) -> CoreSettings:
        """The extraction core's settings of the in-proxy execution: the HAPI server's batch
        adaptation, with ``memory_budget_bytes`` as the CPU device's total (a GPU's comes from
        NVML), so a request that does not fit is refused as the server refuses it."""
        devices = {"auto": None, "cuda": "cuda:0"}.get(self.device, self.device)
        return CoreSettings(
            devices=devices,
            cpu_memory_budget_bytes=self.memory_budget_bytes,
            gpu_memory_limit_bytes=self.gpu_memory_limit_bytes,
            framework_reserve_bytes=self.framework_reserve_bytes,
            count_process_memory=self.count_process_memory,
            max_concurrent_per_device=self.max_concurrent,
            torch_threads=self.torch_threads,
            b_min=self.b_min,
            queue_limit=self.queue_limit,
            request_timeout_s=self.request_timeout,
            retry_after_s=self.retry_after,
            weights_cache_bytes=self.weights_cache_bytes,
            feature_store_bytes=self.feature_store_bytes,
            max_object_bytes=self.max_object_bytes,
            max_weights_bytes=self.max_weights_bytes,
            max_image_pixels=self.max_image_pixels,
            max_samples_per_request=self.max_samples_per_request,
            max_image_bytes=self.max_image_bytes,
            object_read_concurrency=self.object_read_concurrency,
        )

    @classmethod
    def from_paste(
        cls, global_conf: Mapping[str, Any], local_conf: Mapping[str, Any]
    ) -> FilterConfig:
        """The options as Swift's own middlewares read them: ``global_conf``, then the filter's
        section over it. ``[DEFAULT]`` holds the whole proxy's options, so only ours are taken
        from there; in the filter's own section an unknown option is refused (a typo)."""
        merged: dict[str, Any] = {k: v for k, v in global_conf.items() if k in cls.model_fields}
        merged.update(local_conf)
        return cls.from_conf(merged)

    @classmethod
    def from_conf(cls, conf: Mapping[str, object]) -> FilterConfig:
        """Parse the filter's own section (``local_conf``); FilterConfigError on any problem."""
        ours = {k: v for k, v in conf.items() if not _FOREIGN_OPTION.match(k)}
        try:
            config = cls.model_validate(ours)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
                for e in exc.errors()
            )
            raise FilterConfigError(f"[filter:hapi] {problems}") from None
        if config.execution is Execution.DECOUPLED and not config.hapi_servers:
            raise FilterConfigError(
                "[filter:hapi] hapi_servers is required with execution = decoupled "
                "(e.g. hapi_servers = http://127.0.0.1:8090)"
            )
        return config


def _base_url(url: str, option: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{option}: {url!r} is not an http(s)://host[:port] URL")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{option}: {url!r} must be a base URL without a path")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise ValueError(f"{option}: {url!r} has a bad port ({exc})") from None
    return f"{parts.scheme}://{parts.netloc}"
