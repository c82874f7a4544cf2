"""``POST /v1/finetune``: ALL_IN_COS, the server fine-tunes and returns the weights."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from hapi_contract import FINETUNE_PATH, HEADER_METRICS, HEADER_SHA256, FinetuneRequest

from .. import all_in_cos, route_docs
from ..deps import CallerDep, StateDep

router = APIRouter()


@router.post(FINETUNE_PATH, response_class=Response, responses=route_docs.finetune_responses())
async def finetune_route(req: FinetuneRequest, state: StateDep, caller: CallerDep) -> Response:
    """ALL_IN_COS: fine-tune on the server; the body is the trained weights (safetensors)."""
    blob, metrics = await all_in_cos.run_all_in_cos(state, caller, req)
    return Response(
        blob,
        media_type="application/octet-stream",
        headers={HEADER_METRICS: metrics.header(), HEADER_SHA256: metrics.sha256},
    )
