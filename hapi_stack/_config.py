"""Settings of the local Swift all-in-one stack and the tempauth users it creates."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hapi_stack._ports import pick_free_ports

__all__ = ["ADMIN_USER", "OTHER_USER", "PORT_SETTINGS", "StackConfig", "SwiftUser"]


@dataclass(frozen=True)
class SwiftUser:
    """A tempauth user: ``name`` is ``account:user``; ``groups`` are tempauth groups."""

    name: str
    key: str
    groups: tuple[str, ...] = ()

    @property
    def account(self) -> str:
        """The account part of ``name`` (``test`` for ``test:tester``)."""
        return self.name.split(":", 1)[0]


#: Owner of account ``test`` with ``.admin`` rights, as in Swift's own SAIO image.
ADMIN_USER = SwiftUser("test:tester", "testing", (".admin",))
#: A user of another account without admin rights, for access-control tests.
OTHER_USER = SwiftUser("test2:tester2", "testing2")

#: The config fields that name a port, in start order of the services using them.
PORT_SETTINGS = (
    "memcached_port",
    "account_port",
    "container_port",
    "object_port",
    "proxy_port",
    "hapi_port",
)

#: A TCP port number.
Port = Annotated[int, Field(ge=1, le=65535)]


class StackConfig(BaseModel):
    """Where the stack keeps its state and which ports it listens on.

    ``proxy_extra_pipeline`` names filters inserted into the proxy pipeline right after
    ``tempauth`` (so they see an authenticated request); ``proxy_extra_filters`` maps a filter name
    to the options of its ``[filter:NAME]`` section, e.g.
    ``{"hapi": {"paste.filter_factory": "swift_middleware.middleware:filter_factory"}}``.
    With ``hapi_server`` the proxy also runs the ``hapi`` filter (``swift_middleware``) pointed
    at that server; options under ``proxy_extra_filters["hapi"]`` override its defaults (see
    :func:`hapi_stack.proxy_filters`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    state_dir: Path = Path(".hapi")
    host: str = "127.0.0.1"
    proxy_port: Port = 8080
    object_port: Port = 6200
    container_port: Port = 6201
    account_port: Port = 6202
    memcached_port: Port = 11211
    hapi_port: Port = 8090
    hapi_server: bool = False
    proxy_extra_pipeline: list[str] = Field(default_factory=list)
    proxy_extra_filters: dict[str, dict[str, str]] = Field(default_factory=dict)
    log_level: str = "INFO"
    start_timeout: Annotated[float, Field(gt=0)] = 60.0
    stop_timeout: Annotated[float, Field(gt=0)] = 10.0

    @field_validator("host")
    @classmethod
    def _host_is_ip(cls, value: str) -> str:
        # Swift rings store device addresses as IPs; a host name would fail later, less clearly.
        # IPv4 only: URLs and ring device strings are built without IPv6 brackets.
        ipaddress.IPv4Address(value)
        return value

    @field_validator("proxy_extra_pipeline")
    @classmethod
    def _names_are_words(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or any(c.isspace() for c in name):
                raise ValueError(f"pipeline filter names must be single words, got {name!r}")
        return value

    @model_validator(mode="after")
    def _ports_distinct(self) -> StackConfig:
        used: dict[int, str] = {}
        for setting in self.active_port_settings():
            port = getattr(self, setting)
            if port in used:
                raise ValueError(f"{setting} and {used[port]} are both {port}; ports must differ")
            used[port] = setting
        return self

    @classmethod
    def on_free_ports(cls, **fields: Any) -> StackConfig:
        """A config whose ports are all free right now (tests, benchmarks); ``fields`` override.

        Keeps clear of a developer's own stack on the default ports.
        """
        ports = dict(zip(PORT_SETTINGS, pick_free_ports(len(PORT_SETTINGS)), strict=True))
        return cls.model_validate({**ports, **fields})

    def active_port_settings(self) -> tuple[str, ...]:
        """The port settings this configuration really uses (``hapi_port`` only with the server)."""
        return tuple(s for s in PORT_SETTINGS if s != "hapi_port" or self.hapi_server)

    def shape(self) -> dict[str, Any]:
        """The fields that define the running stack (not timeouts), for comparing two configs."""
        data = self.model_dump(mode="json", exclude={"start_timeout", "stop_timeout"})
        data["state_dir"] = str(self.state_dir.resolve())
        return data
