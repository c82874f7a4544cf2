"""``GET /v1/models``: the architectures this server can run."""

from __future__ import annotations

import hapi_models
import torch
from fastapi import APIRouter

from hapi_contract import MODELS_PATH, ModelInfo, TransformSpec

from .. import route_docs

router = APIRouter()


@router.get(MODELS_PATH, response_model=list[ModelInfo], responses=route_docs.models_responses())
async def models() -> list[ModelInfo]:
    out = []
    for name in hapi_models.list_models():
        spec = hapi_models.get_spec(name)
        with torch.device("meta"):  # the layer names only: nothing allocated
            skeleton = spec.builder(1, False)
        out.append(
            ModelInfo(
                name=name,
                num_layers=spec.num_layers,
                default_freeze_index=spec.default_freeze_index,
                layer_names=skeleton.layer_names,
                transform=TransformSpec.model_validate(spec.transform),
            )
        )
    return out
