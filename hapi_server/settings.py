"""The one settings object of the HAPI server (environment variables ``HAPI_*``)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from hapi_core.settings import CoreSettings, MiB


class ServerSettings(CoreSettings, BaseSettings):
    """Every limit is a setting; ``HAPI_<NAME>`` overrides it (e.g. ``HAPI_PORT=9000``).

    The core's settings (adaptation, devices, input limits) are inherited from
    :class:`hapi_core.CoreSettings`; the server adds where it listens and how it reads Swift.
    """

    model_config = SettingsConfigDict(env_prefix="HAPI_", env_file=".env", extra="ignore")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8090, ge=1, le=65535, description="port to listen on")
    swift_url: str = Field(
        "http://127.0.0.1:8080",
        description="base URL of the Swift proxy; a caller's storage URL must live under it",
    )
    swift_url_aliases: str | None = Field(
        None,
        description="other base URLs of the same Swift proxy, comma separated (e.g. "
        "`http://127.0.0.1:8080,http://node0:8080` when clients reach it by several names); "
        "a caller's storage URL may live under any of them, the server still reads only from "
        "`HAPI_SWIFT_URL`",
    )
    swift_timeout_s: float = Field(60.0, gt=0, description="timeout of each request to Swift")
    swift_read_concurrency: int = Field(
        8, ge=1, le=1024, description="most Swift reads one request has in flight at once"
    )

    @property
    def swift_origins(self) -> tuple[str, ...]:
        """``swift_url`` and its aliases: the origins a caller's storage URL may have."""
        aliases = (self.swift_url_aliases or "").replace(",", " ").split()
        return tuple(dict.fromkeys(u.rstrip("/") for u in (self.swift_url, *aliases)))

    send_timeout_s: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="a client that takes no frame of its /v1/extract stream for this long is "
        "cut off, and its memory and slot are freed (the filter's `send_timeout`)",
    )

    send_order_wait_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="the most a response's frames wait, in all, while an older response of "
        "the same client pipeline (`X-Hapi-Pipeline`) is sending, so that the client gets what "
        "it needs next first; 0 sends them side by side",
    )
    send_lowat_bytes: int = Field(
        128 * 1024,
        ge=0,
        le=64 * MiB,
        description="the most a connection's socket holds unsent (`TCP_NOTSENT_LOWAT`; 0: the "
        "kernel's default), so that a frame handed to the kernel is on its way and the send "
        "order holds on the wire",
    )

    # Limits of the HTTP front.
    max_request_body_bytes: int = Field(
        1 * MiB, ge=1024, description="largest request body (413), chunked or not"
    )

    # ALL_IN_COS fine-tuning.
    max_finetune_epochs: int = Field(50, ge=1, description="most epochs of one /v1/finetune")


@lru_cache
def get_settings() -> ServerSettings:
    return ServerSettings()
