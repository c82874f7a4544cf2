"""Unit test of ``hapi_core.finish``: a finished request's images go with its reservation.

On a CPU the planner counts the process's resident memory beyond the plan as occupied, and the
planning round that a release starts measures it at once; images the finished request still
held then counted as occupied, and the request queued behind it was refused 507 (issue 27: a
988 MB folder part read by two requests at once). The process here is a fake whose memory is
the images its job still references.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from hapi_core import finish
from hapi_core.adaptation import DeviceScheduler
from hapi_core.devices import Device
from hapi_core.metrics import Metrics
from hapi_core.solver import Demand
from hapi_server import ServerSettings
from tests.hapi_server.server_helpers import prepared_extraction

pytestmark = pytest.mark.anyio

KB = 1000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_request_queued_behind_is_placed_once_the_images_are_released() -> None:
    settings = ServerSettings(  # type: ignore[call-arg]
        _env_file=None, framework_reserve_bytes=0, b_min=1, adaptation_window_s=0.0
    )
    scheduler = DeviceScheduler(Device("cpu", 100 * KB), settings, Metrics())
    images: list[bytes] = []
    job_images = images  # the job shares the prepared request's list
    scheduler.process_memory = lambda: sum(map(len, job_images))
    first = await scheduler.acquire(Demand("first", KB, 0, 60, 60, 0.0))
    images += [bytes(30 * KB), bytes(30 * KB)]  # read once admitted
    state, prep = prepared_extraction(scheduler, first)
    prep.images = images
    # The first request's 60 kB are its images: nothing outside the plan. The next needs as
    # much, and waits.
    assert scheduler.unplanned_bytes() == 0
    waiting = asyncio.create_task(scheduler.acquire(Demand("next", KB, 0, 60, 60, 1.0)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()

    finish(cast(Any, state), prep, "200")
    got = await asyncio.wait_for(waiting, 10)
    assert got.batch_size == 60 and job_images == []
