"""``GET /healthz``: 200 when Swift answers, 503 with the same body when it does not."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from hapi_contract import HEALTH_PATH, DeviceHealth, Health

from .. import route_docs
from ..deps import StateDep

router = APIRouter()


@router.get(HEALTH_PATH, response_model=Health, responses=route_docs.health_responses())
async def healthz(state: StateDep) -> JSONResponse:
    swift_ok = await state.swift.healthy()
    health = Health(
        status="ok" if swift_ok else "degraded",
        swift=swift_ok,
        swift_url=state.settings.swift_url,
        adaptation=state.settings.adaptation,
        devices=[
            DeviceHealth(
                name=d.name,
                total_bytes=d.total_bytes,
                free_bytes=state.schedulers[d.name].free_bytes(),
                load=state.schedulers[d.name].load,
            )
            for d in state.devices
        ],
    )
    return JSONResponse(health.model_dump(mode="json"), status_code=200 if swift_ok else 503)
