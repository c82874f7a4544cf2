"""``POST /v1/timings``: time a model's head on this server's device (see ``hapi_core.timing``)."""

from __future__ import annotations

from fastapi import APIRouter

from hapi_contract import TIMINGS_PATH, TimingsRequest, TimingsResponse

from .. import core_host, route_docs
from ..deps import CallerDep, StateDep

router = APIRouter()


@router.post(TIMINGS_PATH, response_model=TimingsResponse, responses=route_docs.timings_responses())
async def timings(req: TimingsRequest, state: StateDep, caller: CallerDep) -> TimingsResponse:
    """Time the decode, layers ``[0, split_index)`` and the encoding over a shard's first images."""
    return await core_host.time_request(state, caller, req)
