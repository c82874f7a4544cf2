"""``hapi-server``: run the HAPI server with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import socket

import uvicorn

from .app import create_app
from .settings import ServerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="hapi-server", description=__doc__)
    parser.add_argument("--host", help="bind address (HAPI_HOST)")
    parser.add_argument("--port", type=int, help="port (HAPI_PORT)")
    parser.add_argument(
        "--swift-url", help="the Swift proxy this server reads from (HAPI_SWIFT_URL)"
    )
    parser.add_argument("--log-level", default=os.environ.get("HAPI_LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    overrides = {
        k: v
        for k, v in {"host": args.host, "port": args.port, "swift_url": args.swift_url}.items()
        if v
    }
    settings = ServerSettings(**overrides)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level.lower(),
    )
    try:
        sock = listening_socket(settings)
    except OSError as exc:
        logging.getLogger(__name__).error(
            "cannot listen on %s:%s: %s", settings.host, settings.port, exc
        )
        return 1
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def listening_socket(settings: ServerSettings) -> socket.socket:
    """The server's socket, bound; every connection accepted on it inherits its
    ``TCP_NOTSENT_LOWAT`` (``send_lowat_bytes``): uvicorn sets no socket options of its own."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.create_server((settings.host, settings.port), family=family, backlog=2048)
    if settings.send_lowat_bytes:
        # Linux's value where Python does not name it (it does from 3.12 on some builds).
        option = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, settings.send_lowat_bytes)
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "TCP_NOTSENT_LOWAT unavailable here (%s): responses of one pipeline may share "
                "the link",
                exc,
            )
    return sock
