"""The options of the ``[filter:hapi]`` section, parsed and checked once at proxy start.

Two kinds of options. The filter's own (where it sends requests and how long it waits) are the
fields of :class:`FilterConfig`. The in-proxy execution's are the extraction core's settings,
:class:`hapi_core.CoreSettings`, declared there once: every core field is an option
(:data:`IN_PROXY_OPTIONS` maps each option to its field; four keep the names they had before
the core existed), with the core's type, checks and meaning. Only the defaults in
:data:`PROXY_DEFAULTS` differ from the HAPI server's, each with its reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from hapi_core.settings import CoreSettings, GiB, MiB
from swift_middleware.errors import FilterConfigError

__all__ = ["IN_PROXY_OPTIONS", "PROXY_DEFAULTS", "Execution", "FilterConfig", "ProxyDefault"]

# Options every Swift filter section may carry that are not ours (paste wiring and logging).
_FOREIGN_OPTION = re.compile(r"^(use|paste\.filter_factory|log_\w+|set \S+|__\w+__|here)$")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")

# The in-proxy options named before the core existed: core field -> option. A rename would
# break every proxy-server.conf that sets them.
_OPTION_NAMES: Mapping[str, str] = {
    "cpu_memory_budget_bytes": "memory_budget_bytes",
    "max_concurrent_per_device": "max_concurrent",
    "request_timeout_s": "request_timeout",
    "retry_after_s": "retry_after",
}
# ``devices`` is no option: the proxy runs on one device, named by the filter's ``device``.
_NOT_OPTIONS = frozenset({"devices"})

IN_PROXY_OPTIONS: Mapping[str, str] = MappingProxyType(
    {
        _OPTION_NAMES.get(field, field): field
        for field in CoreSettings.model_fields
        if field not in _NOT_OPTIONS
    }
)
"""Every in-proxy option (as ``proxy-server.conf`` names it) -> its :class:`CoreSettings` field."""


class ProxyDefault(NamedTuple):
    """An in-proxy default that differs from the core's (the HAPI server's)."""

    value: object
    reason: str


PROXY_DEFAULTS: Mapping[str, ProxyDefault] = MappingProxyType(
    {
        "memory_budget_bytes": ProxyDefault(
            2 * GiB,
            "the proxy's memory also serves every plain Swift request, and each proxy worker "
            "plans a budget of its own",
        ),
        "max_concurrent": ProxyDefault(
            2, "extractions share the proxy worker's cores with its routing of all other traffic"
        ),
        "queue_limit": ProxyDefault(
            64,
            "each waiting request holds a proxy connection; a busy proxy answers 503 sooner",
        ),
        "retry_after": ProxyDefault(
            5,
            "also the Retry-After when no HAPI server is up (decoupled), which is not checked "
            "again before health_check_interval (5 s)",
        ),
        "weights_cache_bytes": ProxyDefault(
            1 * GiB, "idle models stay in every proxy worker's memory beside Swift's own"
        ),
        "feature_store_bytes": ProxyDefault(
            0,
            "each proxy worker would keep a store of its own; decoupled execution already "
            "shares through the HAPI server's store",
        ),
    }
)
"""In-proxy option -> its default where it differs from :class:`CoreSettings`', and why."""


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


def _proxy_defaults() -> dict[str, object]:
    """The core fields whose in-proxy default differs, with that default."""
    return {IN_PROXY_OPTIONS[name]: default.value for name, default in PROXY_DEFAULTS.items()}


def _proxy_core_settings() -> CoreSettings:
    return CoreSettings.model_validate(_proxy_defaults())


class FilterConfig(BaseModel):
    """The filter's own options (names as in ``proxy-server.conf``; times in seconds) and, in
    :meth:`core_settings`, the in-proxy execution's.

    Build it with :meth:`from_conf`, which accepts the strings paste hands over.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    execution: Execution = Field(
        Execution.DECOUPLED, description="``decoupled`` (HAPI servers) or ``in_proxy``"
    )
    hapi_servers: list[str] = Field(
        default_factory=list,
        description="HAPI server base URLs, comma or space separated (required with "
        "execution = decoupled)",
    )
    swift_url: str | None = Field(
        None,
        description="this Swift's base URL as the HAPI servers reach it; sent to them as "
        "``X-Storage-Url`` + ``/v1/<account>`` (default: the request's URL)",
    )
    max_body_bytes: Annotated[int, Field(ge=1024, le=64 * MiB)] = Field(
        1 * MiB, description="largest HAPI request body"
    )
    health_check_interval: Annotated[float, Field(ge=0, le=3600)] = Field(
        5.0, description="seconds a ``/healthz`` result is trusted"
    )
    health_timeout: Annotated[float, Field(gt=0, le=60)] = Field(
        2.0, description="seconds for one ``/healthz`` check"
    )
    conn_timeout: Annotated[float, Field(gt=0, le=600)] = Field(
        5.0, description="seconds to connect to a HAPI server"
    )
    node_timeout: Annotated[float, Field(gt=0, le=86400)] = Field(
        600.0, description="seconds to wait for each read from a HAPI server"
    )
    device: str = Field("auto", description="in_proxy: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``")
    send_timeout: Annotated[float, Field(gt=0, le=86400)] = Field(
        60.0,
        description="in_proxy: a client that takes no frame for this long is cut off (its slot "
        "and memory freed; the server's ``HAPI_SEND_TIMEOUT_S``)",
    )

    _core: CoreSettings = PrivateAttr(default_factory=_proxy_core_settings)

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

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {value!r}")
        return value

    # What the filter itself reads of the in-proxy options (its slots and the decoupled 503).
    @property
    def max_concurrent(self) -> int:
        return self._core.max_concurrent_per_device

    @property
    def queue_limit(self) -> int:
        return self._core.queue_limit

    @property
    def request_timeout(self) -> float:
        return self._core.request_timeout_s

    @property
    def retry_after(self) -> int:
        return self._core.retry_after_s

    def core_settings(self) -> CoreSettings:
        """The extraction core's settings of the in-proxy execution: the HAPI server's batch
        adaptation, with ``memory_budget_bytes`` as the CPU device's total (a GPU's comes from
        NVML), so a request that does not fit is refused as the server refuses it."""
        devices = {"auto": None, "cuda": "cuda:0"}.get(self.device, self.device)
        return self._core.model_copy(update={"devices": devices})

    @classmethod
    def options(cls) -> frozenset[str]:
        """Every option name of the ``[filter:hapi]`` section."""
        return frozenset(cls.model_fields) | frozenset(IN_PROXY_OPTIONS)

    @classmethod
    def from_paste(
        cls, global_conf: Mapping[str, Any], local_conf: Mapping[str, Any]
    ) -> FilterConfig:
        """The options as Swift's own middlewares read them: ``global_conf``, then the filter's
        section over it. ``[DEFAULT]`` holds the whole proxy's options, so only ours are taken
        from there; in the filter's own section an unknown option is refused (a typo)."""
        ours = cls.options()
        merged: dict[str, Any] = {k: v for k, v in global_conf.items() if k in ours}
        merged.update(local_conf)
        return cls.from_conf(merged)

    @classmethod
    def from_conf(cls, conf: Mapping[str, object]) -> FilterConfig:
        """Parse the filter's own section (``local_conf``); FilterConfigError on any problem,
        naming every option at fault."""
        own: dict[str, object] = {}
        core = _proxy_defaults()
        for name, value in conf.items():
            if _FOREIGN_OPTION.match(name):
                continue
            field = IN_PROXY_OPTIONS.get(name)
            if field is None:
                own[name] = value  # the filter's own, or unknown: extra="forbid" names it
            else:
                core[field] = _blank_is_unset(CoreSettings, field, value)
        problems: list[str] = []
        config = None
        try:
            config = cls.model_validate({k: _blank_is_unset(cls, k, v) for k, v in own.items()})
        except ValidationError as exc:
            problems += _problems(exc, {})
        try:
            core_settings = CoreSettings.model_validate(core)
        except ValidationError as exc:
            problems += _problems(exc, {f: n for n, f in IN_PROXY_OPTIONS.items()})
        if problems or config is None:
            raise FilterConfigError(f"[filter:hapi] {'; '.join(problems)}")
        config._core = core_settings
        if config.execution is Execution.DECOUPLED and not config.hapi_servers:
            raise FilterConfigError(
                "[filter:hapi] hapi_servers is required with execution = decoupled "
                "(e.g. hapi_servers = http://127.0.0.1:8090)"
            )
        return config


def _blank_is_unset(model: type[BaseModel], name: str, value: object) -> object:
    """``name =`` with nothing after it is the option's unset default where that is None
    (paste hands over the empty string, which no number parses)."""
    field = model.model_fields.get(name)
    if value == "" and field is not None and field.default is None:
        return None
    return value


def _problems(exc: ValidationError, option_of: Mapping[str, str]) -> list[str]:
    """One ``option: message`` per error, named as ``proxy-server.conf`` names the option."""
    out = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        if loc:
            loc[0] = option_of.get(loc[0], loc[0])
        out.append(f"{'.'.join(loc) or 'options'}: {error['msg']}")
    return out


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
