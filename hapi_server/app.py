"""The FastAPI application: a thin factory, routes that delegate, errors as JSON."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Annotated, Any

import hapi_models
from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from hapi_contract import (
    API_PREFIX,
    CONTENT_TYPE_FRAMES,
    ExtractRequest,
    FinetuneRequest,
    ModelInfo,
    TransformSpec,
)

from . import extraction, finetune, route_docs
from .body_limit import BodyLimitMiddleware
from .errors import HapiServerError
from .route_docs import Health
from .settings import ServerSettings, get_settings
from .state import ServerState
from .swift_io import Caller, parse_caller

log = logging.getLogger(__name__)


def _error(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(
        {"detail": detail, "code": code, **extra}, status_code=status, headers=headers
    )


class _ReleasingStreamingResponse(StreamingResponse):
    """Calls ``on_close`` when the response is over, however it ended.

    Starlette can end a response before it starts the body iterator (sending the status line to
    a client that is gone, a cancelled task group), so the generator's ``finally`` alone cannot
    be trusted to release what the request holds.
    """

    def __init__(self, *args: Any, on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            # Close a stream left suspended by a disconnect now, not whenever it is collected.
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def state_of(request: Request) -> ServerState:
    return request.app.state.hapi  # type: ignore[no-any-return]


def caller_of(
    request: Request,
    x_auth_token: Annotated[
        str | None, Header(description="the caller's Swift token (401 without it)")
    ] = None,
    x_storage_url: Annotated[
        str | None,
        Header(
            description="the caller's Swift storage URL, `HAPI_SWIFT_URL/v1/<account>` "
            "(422 without it or for another host)"
        ),
    ] = None,
) -> Caller:
    """The caller's Swift identity, from the headers; the server holds none of its own."""
    return parse_caller(x_auth_token, x_storage_url, state_of(request).settings.swift_url)


State = Annotated[ServerState, Depends(state_of)]
CallerDep = Annotated[Caller, Depends(caller_of)]


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.hapi = ServerState.create(settings)
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

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown paths (404), wrong methods (405)...: the same JSON shape as every other error.
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_").replace("-", "_")
        return _error(exc.status_code, code, str(exc.detail), dict(exc.headers or {}) or None)

    @app.exception_handler(HapiServerError)
    async def hapi_error(_: Request, exc: HapiServerError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.detail, exc.headers or None)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Still a 500, but in the same JSON shape as every other error, and logged with its trace.
        log.exception("unhandled error: %s", exc)
        return _error(500, "internal_error", f"{type(exc).__name__}: {exc}"[:500])

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        parts = [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors[:5]
        ]
        return _error(
            422,
            "invalid_request",
            "; ".join(parts) or "invalid request",
            errors=[{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in errors[:20]],
        )

    # Routes whose success is not JSON name a response class without a media type, so that
    # FastAPI files their ErrorBody answers under application/json (see route_docs).
    @app.post(
        f"{API_PREFIX}/extract",
        response_class=StreamingResponse,
        responses=route_docs.extract_responses(),
    )
    async def extract(req: ExtractRequest, state: State, caller: CallerDep) -> StreamingResponse:
        """Run layers ``[0, split_index)`` over one shard and stream the features."""
        prep = await extraction.prepare(state, caller, req)
        headers = {
            "X-Hapi-Request-Id": prep.request_id,
            "X-Hapi-Device": prep.scheduler.device.name,
            "X-Hapi-Cos-Batch-Size": str(prep.reservation.batch_size),
            "X-Hapi-Samples": str(len(prep.images)),
        }
        return _ReleasingStreamingResponse(
            extraction.stream(state, prep),
            on_close=lambda: extraction.abandon(state, prep),
            media_type=CONTENT_TYPE_FRAMES,
            headers=headers,
        )

    @app.post(
        f"{API_PREFIX}/finetune",
        response_class=Response,
        responses=route_docs.finetune_responses(),
    )
    async def finetune_route(req: FinetuneRequest, state: State, caller: CallerDep) -> Response:
        """ALL_IN_COS: fine-tune on the server; the body is the trained weights (safetensors)."""
        blob, meta = await finetune.run_finetune(state, caller, req)
        return Response(
            blob,
            media_type="application/octet-stream",
            headers={
                "X-Hapi-Metrics": finetune.metrics_header(meta),
                "X-Hapi-Sha256": meta["sha256"],
            },
        )

    @app.get(
        f"{API_PREFIX}/models",
        response_model=list[ModelInfo],
        responses=route_docs.models_responses(),
    )
    async def models() -> list[ModelInfo]:
        out = []
        for name in hapi_models.list_models():
            spec = hapi_models.get_spec(name)
            import torch

            with torch.device("meta"):
                skeleton = spec.builder(1, False)
            t = spec.transform
            out.append(
                ModelInfo(
                    name=name,
                    num_layers=spec.num_layers,
                    default_freeze_index=spec.default_freeze_index,
                    layer_names=skeleton.layer_names,
                    transform=TransformSpec.from_transform(t),
                )
            )
        return out

    @app.get("/healthz", response_model=Health, responses=route_docs.health_responses())
    async def healthz(state: State) -> JSONResponse:
        swift_ok = await state.swift.healthy()
        body = {
            "status": "ok" if swift_ok else "degraded",
            "swift": swift_ok,
            "swift_url": settings.swift_url,
            "adaptation": settings.adaptation,
            "devices": [
                {
                    "name": d.name,
                    "total_bytes": d.total_bytes,
                    "free_bytes": state.schedulers[d.name].free_bytes(),
                    "load": state.schedulers[d.name].load,
                }
                for d in state.devices
            ],
        }
        return JSONResponse(body, status_code=200 if swift_ok else 503)

    @app.get("/metrics", response_class=Response, responses=route_docs.metrics_responses())
    async def metrics(state: State) -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
