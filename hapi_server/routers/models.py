"""``GET /v1/models``: the architectures this server can run."""

from __future__ import annotations

import hapi_models
from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from hapi_contract import MODELS_PATH, ModelInfo, TransformSpec

from .. import route_docs

router = APIRouter()


@router.get(MODELS_PATH, response_model=list[ModelInfo], responses=route_docs.models_responses())
async def models() -> list[ModelInfo]:
    # Off the event loop: the first listing traces every network's graph (seconds), and the
    # server keeps serving meanwhile; later listings read the registry's cached layouts.
    return await run_in_threadpool(_describe_all)


def _describe_all() -> list[ModelInfo]:
    out = []
    for name in hapi_models.list_models():
        spec = hapi_models.get_spec(name)
        out.append(
            ModelInfo(
                name=name,
                num_layers=spec.num_layers,
                default_freeze_index=spec.default_freeze_index,
                layer_names=list(spec.layer_names),
                transform=TransformSpec.model_validate(spec.transform),
            )
        )
    return out
