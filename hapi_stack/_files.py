"""Writes a stack's Swift configuration and rings under its state directory."""

from __future__ import annotations

import json
import logging
import os
import pwd
import subprocess
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from string import Template

from hapi_stack._config import ADMIN_USER, OTHER_USER, StackConfig, SwiftUser
from hapi_stack._paths import StatePaths
from hapi_stack._services import swift_program
from hapi_stack.errors import StackError

__all__ = [
    "HAPI_FILTER",
    "PROXY_PIPELINE",
    "prepare_state_dir",
    "proxy_filters",
    "render_proxy_conf",
]

logger = logging.getLogger(__name__)

#: The proxy pipeline; extra filters go right after ``tempauth``, i.e. after authentication.
PROXY_PIPELINE = (
    "catch_errors gatekeeper healthcheck proxy-logging cache listing_formats tempauth "
    "{extra}copy dlo slo proxy-logging proxy-server"
)
_PART_POWER = 8  # 256 partitions: plenty for one device, quick to build
_RING_SERVERS = ("account", "container", "object")
_DEVICE = "d1"


def _template(name: str) -> Template:
    return Template(resources.files("hapi_stack").joinpath("templates", name).read_text())


def _user_line(user: SwiftUser) -> str:
    account, name = user.name.split(":", 1)
    return f"user_{account}_{name} = {' '.join((user.key, *user.groups))}"


#: The HAPI filter (``swift_middleware``): its pipeline name and paste entry point.
HAPI_FILTER = "hapi"
_HAPI_FILTER_USE = "egg:hapi#hapi"


def proxy_filters(config: StackConfig) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The extra proxy filters: names in pipeline order, and the options of each section.

    Those of ``config``, plus the HAPI filter when the stack runs the HAPI server: it goes first
    (right after ``tempauth``) and points at the stack's HAPI server; options given in
    ``config.proxy_extra_filters["hapi"]`` override its defaults (e.g. ``execution``).
    """
    pipeline = list(config.proxy_extra_pipeline)
    filters = {name: dict(options) for name, options in config.proxy_extra_filters.items()}
    if config.hapi_server and HAPI_FILTER not in pipeline:
        pipeline.insert(0, HAPI_FILTER)
    if HAPI_FILTER in pipeline:
        options = filters.get(HAPI_FILTER, {})
        defaults: dict[str, str] = {}
        if "use" not in options and "paste.filter_factory" not in options:
            defaults["use"] = _HAPI_FILTER_USE
        if config.hapi_server:
            defaults["hapi_servers"] = f"http://{config.local_host}:{config.hapi_port}"
            # The URL the HAPI server reads Swift at; it refuses storage URLs elsewhere.
            defaults["swift_url"] = f"http://{config.public_host}:{config.proxy_port}"
        filters[HAPI_FILTER] = {**defaults, **options}
    return pipeline, filters


def _filter_sections(filters: dict[str, dict[str, str]]) -> str:
    sections = []
    for name, options in filters.items():
        body = "".join(f"{key} = {value}\n" for key, value in options.items())
        sections.append(f"\n[filter:{name}]\n{body}")
    return "".join(sections)


def _run_user() -> str:
    # Swift's servers setuid() to this user; the current one always exists.
    return pwd.getpwuid(os.geteuid()).pw_name


def render_proxy_conf(config: StackConfig) -> str:
    """The text of ``proxy-server.conf`` for ``config``."""
    paths = StatePaths.of(config.state_dir)
    pipeline, filters = proxy_filters(config)
    extra = "".join(f"{name} " for name in pipeline)
    return _template("proxy-server.conf").substitute(
        host=config.host,
        local_host=config.local_host,
        port=config.proxy_port,
        user=_run_user(),
        swift_dir=paths.etc,
        log_level=config.log_level,
        pipeline=PROXY_PIPELINE.format(extra=extra),
        tempauth_users="\n".join(_user_line(u) for u in (ADMIN_USER, OTHER_USER)),
        memcached_port=config.memcached_port,
        extra_filters=_filter_sections(filters),
    )


def _render_storage_conf(config: StackConfig, server: str) -> str:
    paths = StatePaths.of(config.state_dir)
    return _template("storage-server.conf").substitute(
        server=server,
        host=config.local_host,
        port=getattr(config, f"{server}_port"),
        user=_run_user(),
        devices=paths.devices,
        swift_dir=paths.etc,
        log_level=config.log_level,
    )


def _ring_fingerprint(config: StackConfig) -> dict[str, object]:
    return {
        "part_power": _PART_POWER,
        "devices": {
            s: f"{config.local_host}:{getattr(config, f'{s}_port')}" for s in _RING_SERVERS
        },
    }


def _build_ring(paths: StatePaths, server: str, address: str) -> None:
    builder = paths.etc / f"{server}.builder"
    for stale in (builder, paths.etc / f"{server}.ring.gz"):
        stale.unlink(missing_ok=True)
    program = str(swift_program("swift-ring-builder"))
    steps = (
        ["create", str(_PART_POWER), "1", "1"],  # 1 replica, min_part_hours 1
        ["add", f"r1z1-{address}/{_DEVICE}", "1"],
        ["rebalance"],
    )
    for step in steps:
        done = subprocess.run(
            [program, str(builder), *step], capture_output=True, text=True, check=False
        )
        # Exit status 1 is swift-ring-builder's "warning"; 2 is an error.
        if done.returncode >= 2:
            raise StackError(
                f"swift-ring-builder {' '.join(step)} failed for the {server} ring "
                f"(exit {done.returncode}): {(done.stdout + done.stderr).strip()}"
            )


def _build_rings(config: StackConfig, paths: StatePaths) -> bool:
    stamp = paths.etc / "rings.json"
    wanted = _ring_fingerprint(config)
    rings = [paths.etc / f"{s}.ring.gz" for s in _RING_SERVERS]
    if stamp.is_file() and all(r.is_file() for r in rings):
        if json.loads(stamp.read_text()) == wanted:
            return False
    stamp.unlink(missing_ok=True)
    devices: dict[str, str] = wanted["devices"]  # type: ignore[assignment]
    # The three rings are independent; building them side by side hides the interpreter start-up.
    with ThreadPoolExecutor(max_workers=len(_RING_SERVERS)) as pool:
        for future in [pool.submit(_build_ring, paths, s, devices[s]) for s in _RING_SERVERS]:
            future.result()
    stamp.write_text(json.dumps(wanted, indent=2))
    return True


def prepare_state_dir(config: StackConfig) -> bool:
    """Write configs, the devices dir and (when missing or stale) the rings; True if rings built."""
    paths = StatePaths.of(config.state_dir)
    for directory in (paths.etc, paths.devices / _DEVICE, paths.logs):
        directory.mkdir(parents=True, exist_ok=True)
    (paths.etc / "swift.conf").write_text(_template("swift.conf").template)
    for server in _RING_SERVERS:
        paths.conf(server).write_text(_render_storage_conf(config, server))
    paths.conf("proxy").write_text(render_proxy_conf(config))
    built = _build_rings(config, paths)
    logger.debug("state dir %s prepared (rings %s)", paths.root, "built" if built else "kept")
    return built
