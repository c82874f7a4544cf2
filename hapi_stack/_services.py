"""What the stack runs: one :class:`ServiceSpec` per process, in start order."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hapi_stack._config import StackConfig
from hapi_stack._paths import StatePaths, find_script, script_dirs
from hapi_stack._threads import shared_host_env
from hapi_stack.errors import MissingBinaryError

__all__ = ["SWIFT_SERVERS", "ServiceSpec", "stack_services", "swift_bin_dir", "swift_program"]

#: Swift storage servers, then the proxy; the order they start in.
SWIFT_SERVERS = ("account", "container", "object", "proxy")

# The project root when running from a checkout (site-packages when installed): put on the
# PYTHONPATH of processes that import project code (the proxy's middleware, the HAPI server).
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ServiceSpec:
    """One process of the stack.

    ``env`` is added to the caller's environment. ``health_url`` answers 200 when the service is
    ready; ``None`` means "accepts TCP connections on ``port``" (memcached).
    """

    name: str
    argv: tuple[str, ...]
    port: int
    health_url: str | None
    env: dict[str, str] = field(default_factory=dict)


def swift_bin_dir() -> Path:
    """The directory holding ``swift-*`` programs: wherever pip put ``swift-proxy-server``."""
    proxy = find_script("swift-proxy-server")
    return proxy.parent if proxy is not None else Path(sys.executable).parent


def swift_program(name: str) -> Path:
    """The path of a Swift program such as ``swift-ring-builder``, or MissingBinaryError."""
    path = find_script(name)
    if path is None:
        looked_in = ", ".join(str(d) for d in script_dirs())
        raise MissingBinaryError(
            name,
            f"looked in {looked_in}; install Swift for this interpreter with "
            f"`{sys.executable} -m pip install swift` (the project's `swift` extra)",
        )
    return path


def _memcached() -> str:
    path = shutil.which("memcached")
    if path is None:
        raise MissingBinaryError(
            "memcached",
            "Swift's tempauth needs it; install it with `apt-get install memcached`",
        )
    return path


def _pythonpath() -> str:
    current = os.environ.get("PYTHONPATH")
    return f"{_PROJECT_ROOT}{os.pathsep}{current}" if current else str(_PROJECT_ROOT)


def stack_services(config: StackConfig) -> list[ServiceSpec]:
    """The processes ``config`` asks for, in start order; raises MissingBinaryError."""
    paths = StatePaths.of(config.state_dir)
    # Probes and the stack's own calls go to local_host; clients to the advertised public_host.
    local = config.local_host
    memcached = [_memcached(), "-l", local, "-p", str(config.memcached_port)]
    if os.geteuid() == 0:
        memcached += ["-u", "root"]  # memcached refuses to run as root without -u
    services = [ServiceSpec("memcached", tuple(memcached), config.memcached_port, None)]
    for server in SWIFT_SERVERS:
        port: int = getattr(config, f"{server}_port")
        argv = (str(swift_program(f"swift-{server}-server")), str(paths.conf(server)), "-v")
        # The proxy may host the extraction (in_proxy): its torch shares the host's cores.
        env = {"PYTHONPATH": _pythonpath(), **shared_host_env()} if server == "proxy" else {}
        services.append(ServiceSpec(server, argv, port, f"http://{local}:{port}/healthcheck", env))
    if config.hapi_server:
        services.append(
            ServiceSpec(
                "hapi-server",
                (sys.executable, "-m", "hapi_server"),
                config.hapi_port,
                f"http://{local}:{config.hapi_port}/healthz",
                {
                    "HAPI_HOST": config.host,
                    "HAPI_PORT": str(config.hapi_port),
                    # The URL clients' storage URLs name (tempauth builds them from the host
                    # called), and the other names of the same proxy.
                    "HAPI_SWIFT_URL": f"http://{config.public_host}:{config.proxy_port}",
                    "HAPI_SWIFT_URL_ALIASES": ",".join(config.swift_url_aliases()),
                    "PYTHONPATH": _pythonpath(),
                    **shared_host_env(),
                },
            )
        )
    return services
