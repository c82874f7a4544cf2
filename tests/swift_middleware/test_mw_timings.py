"""``X-Hapi-Request: timings`` through the real proxy: forwarded to a HAPI server (decoupled) or
measured in the proxy (in_proxy), both answering the server's ``TimingsResponse``."""

from __future__ import annotations

import httpx
import pytest

from hapi_contract import TimingsResponse
from tests.swift_middleware.mw_support import MwData, ProxyProcess, shard_url

pytestmark = pytest.mark.swift

TIMINGS = {"X-Hapi-Request": "timings"}


def _timings(proxy: ProxyProcess, body: dict[str, object], token: str | None) -> httpx.Response:
    headers = {**TIMINGS, **({"X-Auth-Token": token} if token else {})}
    return httpx.post(shard_url(proxy), json=body, headers=headers, timeout=180)


@pytest.mark.parametrize("execution", ["decoupled", "in_proxy"])
def test_the_filter_answers_timings_of_every_layer_up_to_the_split(
    execution: str,
    decoupled_proxy: ProxyProcess,
    in_proxy_proxy: ProxyProcess,
    mw_data: MwData,
) -> None:
    proxy = decoupled_proxy if execution == "decoupled" else in_proxy_proxy
    body = {**mw_data.body("alexnet", 6), "samples": 2}
    first = _timings(proxy, body, mw_data.token)
    assert first.status_code == 200, first.text
    assert first.headers["x-hapi-execution"] == execution
    got = TimingsResponse.model_validate_json(first.content)
    assert got.arch == "alexnet" and got.samples == 2
    assert len(got.layer_s_per_sample) == len(got.wire_bytes_per_sample) == 6
    assert all(t > 0 for t in got.layer_s_per_sample) and got.decode_s_per_sample > 0
    assert all(b > 0 for b in got.wire_bytes_per_sample)
    # A second request refines the cached layer times: never slower than the first answer.
    again = TimingsResponse.model_validate_json(_timings(proxy, body, mw_data.token).content)
    assert again.cached
    assert all(
        b <= a for a, b in zip(got.layer_s_per_sample, again.layer_s_per_sample, strict=True)
    )


@pytest.mark.parametrize("execution", ["decoupled", "in_proxy"])
def test_timings_are_authorised_and_checked_like_an_extraction(
    execution: str,
    decoupled_proxy: ProxyProcess,
    in_proxy_proxy: ProxyProcess,
    mw_data: MwData,
) -> None:
    proxy = decoupled_proxy if execution == "decoupled" else in_proxy_proxy
    body = {**mw_data.body("alexnet", 3), "samples": 2}
    assert _timings(proxy, body, None).status_code == 401
    assert _timings(proxy, body, mw_data.other_token).status_code == 403
    bad = _timings(proxy, {**body, "samples": 0}, mw_data.token)
    assert bad.status_code == 422, bad.text
    assert bad.json()["code"] == "invalid_request"
