"""``GET /v1/models``: the architectures this server can run."""

from __future__ import annotations

import json
from typing import Any

import hapi_models
from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from hapi_contract import MODELS_PATH, ModelInfo, TransformSpec

from .. import route_docs

router = APIRouter()

#: The response header naming each listed architecture that cannot be run, with its cause.
UNAVAILABLE_HEADER = "X-Hapi-Unavailable-Models"
#: A cause longer than this is cut: a header is not the place for a whole traceback.
_MAX_CAUSE = 500


def _responses() -> dict[int | str, dict[str, Any]]:
    responses = route_docs.models_responses()
    responses[200] = {
        "description": "every architecture the server can run",
        "headers": {
            UNAVAILABLE_HEADER: {
                "description": "present when an installed plugin cannot be listed: a JSON "
                "object from each such architecture's name to the cause (the others are "
                "listed as usual)",
                "schema": {"type": "string"},
            }
        },
    }
    return responses


@router.get(MODELS_PATH, response_model=list[ModelInfo], responses=_responses())
async def models(response: Response) -> list[ModelInfo]:
    # Off the event loop: a listing the cache does not hold yet traces networks (seconds each),
    # and the server keeps serving meanwhile.
    listing = await run_in_threadpool(hapi_models.describe_models)
    if listing.failed:
        # One bad plugin must not hide the others: they are listed, it is named here (and in
        # the server's log, by hapi_models).
        causes = {name: cause[:_MAX_CAUSE] for name, cause in listing.failed.items()}
        response.headers[UNAVAILABLE_HEADER] = json.dumps(causes, ensure_ascii=True)
    return [
        ModelInfo(
            name=model.name,
            num_layers=model.num_layers,
            default_freeze_index=model.default_freeze_index,
            layer_names=list(model.layer_names),
            transform=TransformSpec.model_validate(model.transform),
        )
        for model in listing.models
    ]
