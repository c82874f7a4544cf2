"""The FastAPI application: a thin factory that wires the routers, the body limit and the errors.

The routes live in :mod:`hapi_server.routers` (one module per resource), their dependencies in
:mod:`hapi_server.deps`; every error answers the same JSON shape, the contract's ``ErrorBody``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hapi_core.answers import validation_detail
from hapi_core.errors import HapiCoreError

from .body_limit import BodyLimitMiddleware
from .route_docs import install_openapi
from .routers import extract, finetune, health, metrics, models, timings
from .settings import ServerSettings, get_settings
from .state import ServerState
from .swift_io import SwiftReader

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def _error(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(
        {"detail": detail, "code": code, **extra}, status_code=status, headers=headers
    )


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    # Unknown paths (404), wrong methods (405)...: the same JSON shape as every other error.
    assert isinstance(exc, StarletteHTTPException)
    code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_").replace("-", "_")
    return _error(exc.status_code, code, str(exc.detail), dict(exc.headers or {}) or None)


async def _hapi_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HapiCoreError)
    return _error(exc.status, exc.code, exc.detail, exc.headers or None)


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    # Still a 500, but in the same JSON shape as every other error, and logged with its trace.
    log.exception("unhandled error: %s", exc)
    return _error(500, "internal_error", f"{type(exc).__name__}: {exc}"[:500])


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    return _error(
        422,
        "invalid_request",
        validation_detail(errors),
        errors=[{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in errors[:20]],
    )


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.hapi = ServerState.create(
            settings, swift=SwiftReader(settings.swift_url, settings.swift_timeout_s)
        )
        try:
            yield
        finally:
            await app.state.hapi.aclose()

    app = FastAPI(
        title="HAPI server",
        version="0.1.0",
        summary="Split feature extraction next to OpenStack Swift, with batch adaptation",
        lifespan=lifespan,
    )
    # Pure ASGI, not @app.middleware("http"): that one also re-pipes every streamed chunk, and
    # it saw only Content-Length, so a chunked body of any size went through.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_request_body_bytes)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(HapiCoreError, _hapi_error)
    app.add_exception_handler(Exception, _unexpected)
    app.add_exception_handler(RequestValidationError, _invalid)
    for module in (extract, timings, finetune, models, health, metrics):
        app.include_router(module.router)
    install_openapi(app, settings)
    return app
