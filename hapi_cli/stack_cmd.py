"""``hapi stack up|down|status``: the local Swift all-in-one (and the HAPI server)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pydantic import ValidationError

from hapi_stack import (
    PORT_SETTINGS,
    RunningStack,
    StackConfig,
    StackError,
    down,
    status,
    up,
)

from .parsers import parent_parser

__all__ = ["DEFAULT_HAPI_SERVER", "ERRORS", "register"]

#: Whether ``hapi stack up`` starts the HAPI server unless told otherwise.
DEFAULT_HAPI_SERVER = True  # the CLI stack is Swift + HAPI; the library default stays Swift only
ERRORS: tuple[type[BaseException], ...] = (StackError,)

_DEFAULTS = StackConfig()
_SERVICE_NAMES = {
    "memcached_port": "memcached (Swift's token cache)",
    "account_port": "Swift's account server",
    "container_port": "Swift's container server",
    "object_port": "Swift's object server",
    "proxy_port": "Swift's proxy (the API and tempauth)",
    "hapi_port": "the HAPI server",
}


def _flag(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``stack`` and its actions to the ``hapi`` parser."""
    stack = subparsers.add_parser(
        "stack",
        help="run a local OpenStack Swift (and HAPI server) for development",
        description="Start, stop or inspect the local Swift all-in-one. Processes are recorded "
        "in STATE_DIR/pids.json and stopped by PID only.",
    )
    actions = stack.add_subparsers(dest="stack_action", metavar="ACTION", required=True)
    state = parent_parser()
    state.add_argument(
        "--state-dir",
        type=Path,
        default=_DEFAULTS.state_dir,
        help="configs, rings, data, logs and pids.json (default: %(default)s)",
    )

    start = actions.add_parser(
        "up",
        parents=[state],
        help="start the stack, or only its stopped services (idempotent)",
        description="Start the stack. On a stack that is partly down (a service crashed or was "
        "killed) start only the services that are down and keep the others (and memcached's "
        "tokens) running; give the same settings as the first `up`.",
    )
    start.add_argument(
        "--host",
        default=_DEFAULTS.host,
        help="IPv4 address the proxy and the HAPI server listen on; 0.0.0.0 serves other hosts "
        "(memcached and Swift's storage servers stay on 127.0.0.1) (default: %(default)s)",
    )
    start.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="host name or IPv4 address clients reach the stack at, in the URLs it prints and "
        "the one the HAPI server reads Swift at (default: --host, or for 0.0.0.0 the address "
        "of the default route's interface)",
    )
    for setting in PORT_SETTINGS:
        start.add_argument(
            _flag(setting),
            dest=setting,
            type=int,
            default=getattr(_DEFAULTS, setting),
            metavar="PORT",
            help=f"port of {_SERVICE_NAMES.get(setting, setting)} (default: %(default)s)",
        )
    start.add_argument(
        "--hapi-server",
        action=argparse.BooleanOptionalAction,
        default=DEFAULT_HAPI_SERVER,
        help="also run the HAPI server (python -m hapi_server)",
    )
    start.add_argument(
        "--timeout",
        type=float,
        default=_DEFAULTS.start_timeout,
        help="seconds to wait for the services to become healthy (default: %(default)s)",
    )
    start.set_defaults(func=_up)

    stop = actions.add_parser("down", parents=[state], help="stop what `up` started")
    stop.set_defaults(func=_down)

    show = actions.add_parser(
        "status", parents=[state], help="show the services; exit 0 only if all are healthy"
    )
    show.set_defaults(func=_status)


def _config(**fields: object) -> StackConfig:
    try:
        return StackConfig.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        raise StackError(f"invalid stack settings: {problems}") from exc


def _print_stack(stack: RunningStack) -> None:
    for service in stack.services:
        print(f"  {service.name:<12} pid {service.pid:<8} port {service.port}")
    if stack.config.host != stack.config.public_host:
        print(
            f"Listening: {stack.config.host} (proxy, HAPI); clients use {stack.config.public_host}"
        )
    print(f"Proxy:     {stack.proxy_url}")
    print(f"Auth:      {stack.auth_url}  (tempauth, v1.0)")
    print(f"Admin:     {stack.admin_user} / {stack.admin_key}")
    print(f"Non-admin: {stack.other_user} / {stack.other_key}")
    if stack.hapi_url is not None:
        print(f"HAPI:      {stack.hapi_url}")
    print(f"Logs:      {stack.config.state_dir / 'logs'}")


def _up(args: argparse.Namespace) -> int:
    config = _config(
        state_dir=args.state_dir,
        host=args.host,
        advertise_host=args.advertise_host,
        hapi_server=args.hapi_server,
        start_timeout=args.timeout,
        **{setting: getattr(args, setting) for setting in PORT_SETTINGS},
    )
    began = time.monotonic()
    stack = up(config)
    elapsed = time.monotonic() - began
    if stack.started_now and len(stack.started) < len(stack.services):
        print(
            f"Restarted {', '.join(stack.started)} in {elapsed:.1f} s; the other services kept "
            f"running (state in {stack.config.state_dir}):"
        )
    elif stack.started_now:
        print(f"Started the stack in {elapsed:.1f} s (state in {stack.config.state_dir}):")
    else:
        print(f"Already running (state in {stack.config.state_dir}); started nothing:")
    _print_stack(stack)
    print(f"Stop it with: hapi stack down --state-dir {args.state_dir}")
    return 0


def _down(args: argparse.Namespace) -> int:
    config = _config(state_dir=args.state_dir)
    stopped = down(config)
    if stopped:
        print(f"Stopped {', '.join(stopped)} ({config.state_dir}).")
    else:
        print(f"Nothing was running in {config.state_dir}.")
    return 0


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "NO"


def _status(args: argparse.Namespace) -> int:
    report = status(_config(state_dir=args.state_dir))
    if not report.recorded:
        print(f"No stack recorded in {report.state_dir}.")
        return 1
    rows = [("SERVICE", "PID", "PORT", "ALIVE", "HEALTHY")]
    rows += [
        (s.name, str(s.pid), str(s.port), _yes_no(s.alive), _yes_no(s.healthy))
        for s in report.services
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())
    print(f"State: {report.state_dir}  ({'running' if report.running else 'NOT healthy'})")
    return 0 if report.running else 1
