"""``hapi-server``: run the HAPI server with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os

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
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level.lower(),
    )
    return 0
