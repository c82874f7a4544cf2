"""The server performs a ``GetMany`` with async reads, at most ``concurrency`` at once (a fake reader).

The reads are the server's own ``SwiftReader.get`` calls as the caller; here a fake stands in
for it, so the bound and the stop at a refusal can be counted exactly (the real reads are covered by
``test_extract_in_place.py``).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from hapi_core import ForbiddenError, GetMany, StoredObject
from hapi_core.metrics import Metrics
from hapi_server.core_host import ServerHost
from hapi_server.state import ServerState
from hapi_server.swift_io import Caller

CALLER = Caller(token="AUTH_tk-caller", storage_url="http://swift/v1/AUTH_test")


class FakeReader:
    """Counts reads in flight; each waits until ``release`` is set (or one refuses)."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.in_flight = 0
        self.most = 0
        self.started: list[str] = []
        self.finished: list[str] = []
        self.callers: set[Caller] = set()
        self.release = asyncio.Event()

    async def get(self, caller: Caller, container: str, obj: str, *, max_bytes: int) -> Any:
        self.callers.add(caller)
        self.started.append(obj)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            if obj == self.refuse:
                raise ForbiddenError(f"no read access to {container}/{obj} (Swift says 403)")
            await self.release.wait()
            self.finished.append(obj)
            return StoredObject(f"{container}/{obj}/{max_bytes}".encode(), "etag")
        finally:
            self.in_flight -= 1


def _host(reader: FakeReader) -> ServerHost:
    state = SimpleNamespace(swift=reader, metrics=Metrics())
    return ServerHost(cast(ServerState, state), CALLER)


def test_reads_are_the_callers_in_order_and_at_most_concurrency_at_once() -> None:
    async def scenario() -> tuple[list[StoredObject], FakeReader]:
        reader = FakeReader()
        host = _host(reader)
        names = tuple(f"img/{i}.jpg" for i in range(20))
        task = asyncio.create_task(host.get_many(GetMany("images", names, 99, 5)))
        while reader.in_flight < 5:  # the first five start; no sixth while they wait
            await asyncio.sleep(0)
        for _ in range(10):
            await asyncio.sleep(0)
        assert reader.in_flight == 5 and len(reader.started) == 5
        reader.release.set()
        return await task, reader

    got, reader = asyncio.run(scenario())
    assert [o.data for o in got] == [f"images/img/{i}.jpg/99".encode() for i in range(20)]
    assert reader.most == 5 and reader.callers == {CALLER}


def test_a_refusal_stops_new_reads_and_is_raised_after_those_in_flight_finish() -> None:
    async def scenario() -> FakeReader:
        reader = FakeReader(refuse="img/2.jpg")
        names = tuple(f"img/{i}.jpg" for i in range(50))
        task = asyncio.create_task(_host(reader).get_many(GetMany("images", names, 99, 4)))
        while "img/2.jpg" not in reader.started or reader.in_flight < 3:
            await asyncio.sleep(0)
        for _ in range(10):  # a fifth read, or an early answer, has every chance: neither comes
            await asyncio.sleep(0)
        assert not task.done() and len(reader.started) == 4
        reader.release.set()
        with pytest.raises(ForbiddenError, match="images/img/2.jpg"):
            await task
        return reader

    reader = asyncio.run(scenario())
    assert reader.in_flight == 0  # nothing left running
    assert sorted(reader.finished) == ["img/0.jpg", "img/1.jpg", "img/3.jpg"]
    assert len(reader.started) == 4  # none started after the refusal
