"""A job that fails after its response started gives its memory back with its error frame.

``test_server_oom.py`` shows the end-to-end effect (a server whose requests ran out of memory
serves again); this pins the mechanism down without timing: with only reference counting at
work (no garbage collection), nothing of the failed job outlives its stream and its worker.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
import torch

from hapi_contract import Compression, OutputDtype, RemoteStreamError
from hapi_contract.frames import FrameDecoder, FrameEncoder
from hapi_core.adaptation import DeviceScheduler
from hapi_core.devices import Device
from hapi_core.engine import BatchExecutionError
from hapi_core.metrics import Metrics
from hapi_core.solver import Demand
from hapi_server import ServerSettings, core_host

from .server_helpers import prepared_extraction

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Job:
    """What the stream needs of a job: its encoder (weakref-able, unlike a namespace)."""

    def __init__(self) -> None:
        self.encoder = FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE)


async def test_a_failed_job_leaves_nothing_behind_its_error_frame(
    monkeypatch: pytest.MonkeyPatch, no_collector: None
) -> None:
    settings = ServerSettings(_env_file=None, framework_reserve_bytes=0, b_min=1)  # type: ignore[call-arg]
    scheduler = DeviceScheduler(Device("cpu", 100_000), settings, Metrics())
    reservation = await scheduler.acquire(Demand("r1", 1_000, 0, 1, 100, 0.0))
    state, prep = prepared_extraction(scheduler, reservation)
    state.executor = executor = ThreadPoolExecutor(1)
    jobs = [_Job()]
    batches: list[weakref.ref[torch.Tensor]] = []

    def runs_out(job: _Job, emit: object, cancelled: object) -> object:
        batch = torch.zeros(16, 3, 32, 32)  # a local of the failing frame, as the engine's
        batches.append(weakref.ref(batch))
        try:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        except RuntimeError as exc:
            raise BatchExecutionError(str(exc)) from exc

    monkeypatch.setattr(core_host, "job_of", lambda rt, prep: jobs[0])
    monkeypatch.setattr(core_host, "run_extraction", runs_out)
    body = b"".join([frame async for frame in core_host.stream(cast(Any, state), prep)])
    with pytest.raises(RemoteStreamError) as failed:
        FrameDecoder().feed(body)
    assert failed.value.status == 507 and "can't allocate memory" in failed.value.detail
    executor.shutdown(wait=True)  # the worker thread has unwound: nothing of it holds the job
    assert prep.finished and scheduler.free_bytes() == 100_000

    kept = weakref.ref(jobs.pop())
    assert kept() is None and [ref() is None for ref in batches] == [True]
