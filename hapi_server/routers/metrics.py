"""``GET /metrics``: Prometheus metrics of this server."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hapi_contract import METRICS_PATH

from .. import route_docs
from ..deps import StateDep

router = APIRouter()


@router.get(METRICS_PATH, response_class=Response, responses=route_docs.metrics_responses())
async def metrics(state: StateDep) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
