"""The in-proxy execution plans memory as the HAPI server does: the Swift proxy is not a victim.

Before the extraction core was shared, the filter picked the COS batch with no memory planning:
one ``POST`` (resnet18, split 14, a 1024x1024 transform) took a proxy from 0.9 GiB to more
than 9 GiB. Now one core admits or refuses a request in both executions, with one answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from hapi_core.estimates import MemoryEstimator
from hapi_stack import RunningStack
from tests.hapi_server.conftest import ServerProcess, start_server
from tests.swift_middleware.mw_support import MwData, ProxyProcess, extract, shard_url

pytestmark = pytest.mark.swift

GiB = 2**30
BUDGET = 2 * GiB
RESERVE = 256 * 2**20
B_MIN = 25  # the default of both hosts
ARCH, SPLIT = "resnet18", 14


@pytest.fixture(scope="module")
def budget_proxy(proxy_factory: Callable[..., ProxyProcess]) -> ProxyProcess:
    """In-proxy execution with a 2 GiB budget."""
    return proxy_factory(
        execution="in_proxy",
        torch_threads="1",
        memory_budget_bytes=str(BUDGET),
        framework_reserve_bytes=str(RESERVE),
    )


@pytest.fixture(scope="module")
def budget_server(
    swift_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A HAPI server with the same core settings as :func:`budget_proxy`."""
    server = start_server(
        swift_stack,
        tmp_path_factory.mktemp("hapi-budget-server"),
        cpu_memory_budget_bytes=BUDGET,
        framework_reserve_bytes=RESERVE,
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def budget_decoupled(
    proxy_factory: Callable[..., ProxyProcess],
    budget_server: ServerProcess,
    swift_stack: RunningStack,
) -> ProxyProcess:
    return proxy_factory(hapi_servers=budget_server.url, swift_url=swift_stack.proxy_url)


def _status(proxy: ProxyProcess, field: str) -> int:
    """``field`` (``VmHWM``: the resident high-water mark, ``VmRSS``) of the proxy, in bytes."""
    for line in Path(f"/proc/{proxy.process.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/PID/status")


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB"


def _per_sample(side: int) -> int:
    return MemoryEstimator().estimate(ARCH, 3, (3, side, side), SPLIT, "cpu").bytes_per_sample


def test_a_request_that_cannot_fit_is_refused_by_the_proxy_as_by_the_server(
    budget_proxy: ProxyProcess, budget_decoupled: ProxyProcess, mw_data: MwData
) -> None:
    side = 1024
    # The premise: even the smallest batch the adaptation may hand out does not fit.
    assert min(B_MIN, len(mw_data.images)) * _per_sample(side) > BUDGET - RESERVE
    body = mw_data.body(ARCH, SPLIT, side=side, b_max=64)
    before = {f: _status(budget_proxy, f) for f in ("VmHWM", "VmRSS")}
    inside = extract(shard_url(budget_proxy), body, mw_data.headers())
    after = {f: _status(budget_proxy, f) for f in ("VmHWM", "VmRSS")}
    server = extract(shard_url(budget_decoupled), body, mw_data.headers())
    # The figures for a report (shown with -s).
    print(
        f"\nin-proxy memory, {ARCH} split {SPLIT} {side}x{side} refused with {inside.status}: "
        f"VmHWM {_mib(before['VmHWM'])} -> {_mib(after['VmHWM'])}, "
        f"VmRSS {_mib(before['VmRSS'])} -> {_mib(after['VmRSS'])}, "
        f"budget {_mib(BUDGET)} (reserve {_mib(RESERVE)}; smallest batch needs "
        f"{_mib(min(B_MIN, len(mw_data.images)) * _per_sample(side))})"
    )
    assert (inside.status, server.status) == (507, 507), (inside.body, server.body)
    assert inside.headers["x-hapi-execution"] == "in_proxy"
    refusal = json.loads(inside.body)
    assert refusal["code"] == json.loads(server.body)["code"] == "insufficient_memory"
    assert "lower b_max or the split index" in refusal["detail"]
    # Refused before anything ran: the proxy never held more than its budget.
    assert after["VmHWM"] < BUDGET


def test_a_request_that_fits_runs_at_a_planned_batch_within_the_budget(
    budget_proxy: ProxyProcess, mw_data: MwData
) -> None:
    side = 512
    samples = len(mw_data.images)
    assert samples * _per_sample(side) < BUDGET - RESERVE  # the premise: the whole shard fits
    before = _status(budget_proxy, "VmRSS")
    got = extract(shard_url(budget_proxy), mw_data.body(ARCH, SPLIT, side=side), mw_data.headers())
    assert got.status == 200, got.body
    assert got.end is not None and sum(got.end.meta["cos_batch_sizes"]) == samples
    assert int(got.headers["x-hapi-cos-batch-size"]) == max(got.end.meta["cos_batch_sizes"])
    peak = _status(budget_proxy, "VmHWM")
    print(
        f"\nin-proxy memory, {ARCH} split {SPLIT} {side}x{side} served at COS batches "
        f"{got.end.meta['cos_batch_sizes']}: VmRSS before {_mib(before)}, VmHWM after "
        f"{_mib(peak)}, VmRSS after {_mib(_status(budget_proxy, 'VmRSS'))}, budget {_mib(BUDGET)}"
    )
    # What the request added to the proxy stays within what the planner may hand out.
    assert peak - before < BUDGET - RESERVE


def test_both_executions_refuse_a_request_without_a_token_on_a_public_container(
    in_proxy_proxy: ProxyProcess,
    decoupled_proxy: ProxyProcess,
    mw_data: MwData,
    swift_stack: RunningStack,
) -> None:
    conn = swift_stack.connection()
    public = "hapi-mw-public"
    conn.put_container(public, headers={"X-Container-Read": ".r:*,.rlistings"})
    shard = conn.get_object("hapi-mw-data", "shards/shard-000000.tar")[1]
    conn.put_object(public, "shard.tar", shard)
    obj, sha = mw_data.weights["alexnet"]
    conn.put_object(public, obj, conn.get_object("hapi-mw-models", obj)[1])
    conn.close()
    body = mw_data.body("alexnet", 3)
    body["model"]["weights"] = {"container": public, "object": obj, "sha256": sha}
    anonymous = {"X-Hapi-Request": "extract"}
    for proxy in (in_proxy_proxy, decoupled_proxy):
        got = extract(shard_url(proxy, public, "shard.tar"), body, anonymous)
        assert got.status == 401, (proxy.url, got.body)
        assert json.loads(got.body)["code"] == "unauthorized"
    # The container is public indeed: Swift serves a plain GET of the shard without a token.
    assert httpx.get(f"{swift_stack.proxy_url}/v1/AUTH_test/{public}/shard.tar").status_code == 200
