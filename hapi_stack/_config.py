"""Settings of the local Swift all-in-one stack and the tempauth users it creates."""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hapi_stack._ports import pick_free_ports

__all__ = [
    "ADMIN_USER",
    "OTHER_USER",
    "PORT_SETTINGS",
    "PUBLIC_PORT_SETTINGS",
    "WILDCARD_HOST",
    "StackConfig",
    "SwiftUser",
    "default_advertise_host",
]


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

#: The services other hosts call (the proxy, the HAPI server): they listen on ``host``; the
#: others (memcached, Swift's storage servers: no authentication) only on ``local_host``.
PUBLIC_PORT_SETTINGS = ("proxy_port", "hapi_port")

#: ``host`` meaning every interface.
WILDCARD_HOST = "0.0.0.0"  # noqa: S104 (listening everywhere is what it asks for)

_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?"
)
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
_ROUTE_PROBE = ("203.0.113.1", 9)  # TEST-NET-3: a UDP connect() only picks the route, sends nothing


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower().rstrip(".") in _LOOPBACK_NAMES


def default_advertise_host() -> str | None:
    """What clients on other hosts reach this machine at, for a stack bound to ``0.0.0.0``.

    The source address of the default IPv4 route (the interface other hosts most likely share),
    else a non-loopback IPv4 address this host's name resolves to, else its FQDN unless that is a
    loopback name; None when there is none. An address rather than the FQDN first: the FQDN
    often resolves only here (Debian's ``/etc/hosts`` maps it to 127.0.1.1) or to nothing on
    other hosts, and tempauth puts the host clients called into their storage URL.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(_ROUTE_PROBE)
            address = str(probe.getsockname()[0])
        if not _is_loopback(address) and address != WILDCARD_HOST:
            return address
    except OSError:
        pass  # no default route
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        infos = []
    for info in infos:
        if not _is_loopback(str(info[4][0])):
            return str(info[4][0])
    fqdn = socket.getfqdn()
    return None if _is_loopback(fqdn) else fqdn


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

    Addresses: ``host`` is the IPv4 address the proxy and the HAPI server listen on
    (``0.0.0.0``: every interface); memcached and Swift's storage servers, which authenticate
    nobody, listen on :attr:`local_host` only. ``advertise_host`` is the host name or address
    clients use (:attr:`public_host`, in the URLs the stack hands out and the one the HAPI server
    reads Swift at); unset, it is ``host``, or for ``0.0.0.0``
    :func:`default_advertise_host`, filled in by :func:`hapi_stack.up`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    state_dir: Path = Path(".hapi")
    host: str = "127.0.0.1"
    advertise_host: str | None = None
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

    @field_validator("advertise_host")
    @classmethod
    def _advertise_is_a_host(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            if not _HOST_NAME.fullmatch(value):
                raise ValueError(
                    f"must be a host name or an IPv4 address (no scheme, no port), got {value!r}"
                ) from None
            return value
        if address.version != 4 or address.is_unspecified:
            raise ValueError(f"must be a host name or an IPv4 address clients reach, got {value!r}")
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

    @property
    def local_host(self) -> str:
        """Where the stack's own processes reach each other: ``host``, or 127.0.0.1 for 0.0.0.0."""
        return "127.0.0.1" if self.host == WILDCARD_HOST else self.host

    @property
    def public_host(self) -> str:
        """The host clients use: ``advertise_host``, else ``host`` unless it is 0.0.0.0."""
        if self.advertise_host is not None:
            return self.advertise_host
        if self.host != WILDCARD_HOST:
            return self.host
        return default_advertise_host() or self.local_host

    def bind_host(self, setting: str) -> str:
        """The address the service of port ``setting`` listens on (see the class docstring)."""
        return self.host if setting in PUBLIC_PORT_SETTINGS else self.local_host

    def advertised(self) -> StackConfig:
        """This config with ``advertise_host`` filled in when ``host`` is 0.0.0.0.

        Raises ValueError when this machine has no address other hosts could use.
        """
        if self.advertise_host is not None or self.host != WILDCARD_HOST:
            return self
        found = default_advertise_host()
        if found is None:
            raise ValueError(
                "the stack listens on 0.0.0.0 but this machine has no non-loopback address or "
                "name to hand clients; give one with advertise_host (--advertise-host)"
            )
        return self.model_copy(update={"advertise_host": found})

    def swift_url_aliases(self) -> tuple[str, ...]:
        """Other base URLs clients may reach the proxy at (``HAPI_SWIFT_URL_ALIASES``).

        tempauth builds a storage URL from the host a client called, so every name the proxy
        answers under must be accepted by the HAPI server: ``host`` when another host is
        advertised, and for 0.0.0.0 loopback and this machine's names and addresses.
        """
        hosts = [self.host, self.local_host]
        if self.host == WILDCARD_HOST:
            hosts += ["localhost", socket.gethostname(), socket.getfqdn()]
            try:
                infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
            except OSError:
                infos = []
            hosts += [str(info[4][0]) for info in infos]
            if (route := default_advertise_host()) is not None:
                hosts.append(route)
        public = self.public_host
        return tuple(
            dict.fromkeys(
                f"http://{h}:{self.proxy_port}"
                for h in hosts
                if h and h != public and h != WILDCARD_HOST
            )
        )

    def active_port_settings(self) -> tuple[str, ...]:
        """The port settings this configuration really uses (``hapi_port`` only with the server)."""
        return tuple(s for s in PORT_SETTINGS if s != "hapi_port" or self.hapi_server)

    def shape(self) -> dict[str, Any]:
        """The fields that define the running stack (not timeouts), for comparing two configs."""
        data = self.model_dump(mode="json", exclude={"start_timeout", "stop_timeout"})
        data["state_dir"] = str(self.state_dir.resolve())
        return data
