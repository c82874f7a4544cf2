#!/usr/bin/env python3
"""Entry point of the Swift container: the native stack's own ``up``, kept in the foreground.

It starts exactly what ``hapi stack up`` starts (memcached, the account, container, object and
proxy servers; configs and rings from :mod:`hapi_stack`), with the ``hapi`` filter in the proxy
pipeline, then waits. SIGTERM or SIGINT stops every service and exits 0; a service that dies
stops the rest and exits 1, so the container restarts or shows as failed.

Environment (every value is optional):

``HAPI_STATE_DIR``           configs, rings, data and logs (default ``/srv/hapi``)
``HAPI_STACK_<FIELD>``       a :class:`hapi_stack.StackConfig` field, e.g. ``HAPI_STACK_HOST``
                             (default ``0.0.0.0``: reachable from the other containers) or
                             ``HAPI_STACK_PROXY_PORT`` (default 8080)
``HAPI_FILTER_<OPTION>``     an option of ``[filter:hapi]``, e.g. ``HAPI_FILTER_HAPI_SERVERS``,
                             ``HAPI_FILTER_SWIFT_URL``, ``HAPI_FILTER_EXECUTION``. The filter is
                             in the pipeline when any is set.
``HAPI_CHECK_INTERVAL``      seconds between liveness checks (default 5)
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from hapi_stack import (
    HAPI_FILTER,
    StackConfig,
    StackError,
    StackNotRunningError,
    down,
    running_stack,
    up,
)

logger = logging.getLogger("hapi.swift-container")

_STACK_PREFIX = "HAPI_STACK_"
_FILTER_PREFIX = "HAPI_FILTER_"


def config_from_env(env: Mapping[str, str]) -> StackConfig:
    """The stack the container runs, from ``env`` (see the module docstring)."""
    fields: dict[str, object] = {
        "state_dir": Path(env.get("HAPI_STATE_DIR", "/srv/hapi")),
        "host": "0.0.0.0",  # noqa: S104 - a container serves its network, not its loopback
    }
    for name, value in env.items():
        if name.startswith(_STACK_PREFIX):
            fields[name[len(_STACK_PREFIX) :].lower()] = value
    options = {
        name[len(_FILTER_PREFIX) :].lower(): value
        for name, value in env.items()
        if name.startswith(_FILTER_PREFIX) and value
    }
    if options:
        fields["proxy_extra_pipeline"] = [HAPI_FILTER]
        fields["proxy_extra_filters"] = {HAPI_FILTER: options}
    return StackConfig.model_validate(fields)


def _stop_signal_sockets() -> tuple[socket.socket, socket.socket]:
    """A socket that receives one byte (the signal number) per SIGTERM or SIGINT from now on.

    Handlers and a wakeup fd, not a blocked mask: the services this process starts inherit a
    blocked mask (a container stop would then wait out its grace period and kill them), while
    handled signals go back to their default in an exec'd child. A signal that arrives while
    the stack starts is kept in the socket, so the loop below cannot miss it. Returns the
    receiving end, then the sending end, which must stay open as long as the receiver is used.
    """
    receiver, sender = socket.socketpair()
    sender.setblocking(False)
    signal.set_wakeup_fd(sender.fileno(), warn_on_full_buffer=False)
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda _signum, _frame: None)
    return receiver, sender


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = config_from_env(os.environ)
    interval = float(os.environ.get("HAPI_CHECK_INTERVAL", "5"))
    stop_signals, _wakeup = _stop_signal_sockets()
    try:
        stack = up(config)
    except StackError as exc:
        logger.error("cannot start Swift: %s", exc)
        return 1
    logger.info(
        "Swift is up at %s (auth %s, user test:tester / testing); logs in %s",
        stack.proxy_url,
        stack.auth_url,
        stack.config.state_dir / "logs",
    )
    code = 0
    try:
        while True:
            readable, _, _ = select.select([stop_signals], [], [], interval)
            if readable:
                received = stop_signals.recv(1)[0]
                logger.info("got %s; stopping Swift", signal.Signals(received).name)
                break
            try:
                running_stack(stack.config)
            except StackNotRunningError:
                logger.error(
                    "a Swift service died; stopping the rest (logs in %s)",
                    stack.config.state_dir / "logs",
                )
                code = 1
                break
    finally:
        stopped = down(stack.config)
        logger.info("stopped: %s", ", ".join(stopped) or "nothing")
    return code


if __name__ == "__main__":
    sys.exit(main())
