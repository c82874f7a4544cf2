"""Bad and hostile HAPI requests through the Swift filter, in both execution modes.

Every case goes through a real Swift proxy with the filter (decoupled: forwarding to a real HAPI
server; in_proxy: running the extraction itself) and must get the same 4xx status and JSON
``code`` in both modes, the ones the HAPI server answers for the same input. After the cases,
both proxies still serve a valid request.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from hapi_contract import write_shard
from hapi_stack import RunningStack
from tests.hapi_server.bad_inputs import NOT_JPEG, bomb_png, deep_json, raw_post
from tests.hapi_server.server_helpers import put_object
from tests.swift_middleware.mw_support import (
    MW_DATA,
    SHARD,
    MwData,
    ProxyProcess,
    extract,
    shard_url,
)

pytestmark = pytest.mark.swift

BOMB = "bad/bomb.tar"
NOT_AN_IMAGE = "bad/not-jpeg.tar"
MODES = ["decoupled_proxy", "in_proxy_proxy"]


@pytest.fixture(scope="module")
def bad_shards(swift_stack: RunningStack, mw_data: MwData) -> MwData:
    good = (mw_data.images[0], "jpg")
    for name, samples in (
        (BOMB, [good, (bomb_png(), "png")]),
        (NOT_AN_IMAGE, [good, (NOT_JPEG, "jpg")]),
    ):
        data = write_shard((f"s{i:06d}", img, ext, 0) for i, (img, ext) in enumerate(samples))
        put_object(swift_stack, name, data, container=MW_DATA)
    return mw_data


@pytest.fixture(params=MODES)
def proxy(request: pytest.FixtureRequest, bad_shards: MwData) -> Iterator[ProxyProcess]:
    """Each filter mode; after the test it must still serve a valid request."""
    proxy: ProxyProcess = request.getfixturevalue(request.param)
    yield proxy
    got = extract(shard_url(proxy), bad_shards.body("alexnet", 3), bad_shards.headers())
    assert got.status == 200, got.body
    assert got.labels() == bad_shards.labels


def assert_json_error(status: int, body: bytes, expected: int, code: str) -> dict[str, Any]:
    assert status == expected, (status, body[:500])
    answer = json.loads(body)
    assert answer["code"] == code and answer["detail"], answer
    return dict(answer)


def post(proxy: ProxyProcess, path: str, body: bytes, data: MwData) -> tuple[int, bytes]:
    """POST ``path`` as written (no client-side resolution of dot segments)."""
    return raw_post(proxy.url, path, body, data.headers())


def _body(data: MwData, **change: Any) -> bytes:
    return json.dumps(data.body("alexnet", 3, **change)).encode()


def _weights(data: MwData, **change: Any) -> bytes:
    body = data.body("alexnet", 3)
    for key, value in change.items():
        if key in ("arch", "num_classes"):
            body["model"][key] = value
        else:
            body["model"]["weights"][key] = value
    return json.dumps(body).encode()


OBJ = f"/v1/AUTH_test/{MW_DATA}/{SHARD}"

# name -> (path, body maker, status, code)
CASES: dict[str, tuple[str, Callable[[MwData], bytes], int, str]] = {
    "bomb": (f"/v1/AUTH_test/{MW_DATA}/{BOMB}", _body, 413, "too_large"),
    "not-an-image": (f"/v1/AUTH_test/{MW_DATA}/{NOT_AN_IMAGE}", _body, 422, "invalid_shard"),
    "deeply-nested-json": (OBJ, lambda d: deep_json(200_000), 400, "bad_hapi_request"),
    "nested-past-the-depth-limit": (OBJ, lambda d: deep_json(100), 400, "bad_hapi_request"),
    "integer-too-long": (
        OBJ,
        lambda d: b'{"b_max": ' + b"9" * 5000 + b"}",
        400,
        "bad_hapi_request",
    ),
    # Dot segments in the URL, sent as written: refused before anything is authorised.
    "dotdot-in-object": (
        f"/v1/AUTH_test/{MW_DATA}/x/../{SHARD}",
        _body,
        422,
        "invalid_name",
    ),
    "dot-in-object": (f"/v1/AUTH_test/{MW_DATA}/./{SHARD}", _body, 422, "invalid_name"),
    "dotdot-object-last": (f"/v1/AUTH_test/{MW_DATA}/{SHARD}/..", _body, 422, "invalid_name"),
    "dot-container": (f"/v1/AUTH_test/./{SHARD}", _body, 422, "invalid_name"),
    "dotdot-container": (f"/v1/AUTH_test/../{MW_DATA}/{SHARD}", _body, 422, "invalid_name"),
    "dotdot-account": (f"/v1/../AUTH_test/{MW_DATA}/{SHARD}", _body, 422, "invalid_name"),
    "dotdot-weights": (
        OBJ,
        lambda d: _weights(d, object="x/../alexnet.safetensors"),
        422,
        "invalid_name",
    ),
    "dot-weights-container": (OBJ, lambda d: _weights(d, container="."), 422, "invalid_name"),
    # The server's cheap model checks, in both modes.
    "weights-of-another-arch": (
        OBJ,
        lambda d: _weights(d, object=d.weights["resnet18"][0], sha256=d.weights["resnet18"][1]),
        422,
        "invalid_request",
    ),
    "model-over-weights-limit": (
        OBJ,
        lambda d: _weights(d, arch="vgg19", num_classes=100_000),
        413,
        "too_large",
    ),
    "crop-too-small": (
        OBJ,
        lambda d: _body(d, transform={"resize": 8, "crop": 8, "mean": [0, 0, 0], "std": [1, 1, 1]}),
        422,
        "invalid_request",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_filter_refuses_bad_input(case: str, proxy: ProxyProcess, bad_shards: MwData) -> None:
    path, make, status, code = CASES[case]
    got, body = post(proxy, path, make(bad_shards), bad_shards)
    assert_json_error(got, body, status, code)


def test_both_modes_and_the_server_answer_the_same(
    decoupled_proxy: ProxyProcess,
    in_proxy_proxy: ProxyProcess,
    bad_shards: MwData,
    mw_server: Any,
    swift_stack: RunningStack,
) -> None:
    """The in-proxy mode reuses the server's checks: same status, code and detail."""
    for shard in (BOMB, NOT_AN_IMAGE):
        path = f"/v1/AUTH_test/{MW_DATA}/{shard}"
        answers = [
            post(p, path, _body(bad_shards), bad_shards) for p in (decoupled_proxy, in_proxy_proxy)
        ]
        direct = httpx.post(
            f"{mw_server.url}/v1/extract",
            json={**bad_shards.body("alexnet", 3), "container": MW_DATA, "shard": shard},
            headers={
                "X-Auth-Token": bad_shards.token,
                "X-Storage-Url": swift_stack.account_url("test"),
            },
            timeout=120,
        )
        bodies = [json.loads(b) for _, b in answers] + [direct.json()]
        assert {s for s, _ in answers} == {direct.status_code}
        assert bodies[0] == bodies[1] == bodies[2], bodies


def test_a_dot_segment_name_is_refused_not_looked_up(
    decoupled_proxy: ProxyProcess, bad_shards: MwData
) -> None:
    """Before the fix the filter looked the literal name up (a 404 for ``x/../<shard>``); the
    server would then have read ``<shard>``. Now it is a 422 before any lookup: the same
    request to a readable name gives 200, so the 422 is about the name alone."""
    ok, _ = post(decoupled_proxy, OBJ, _body(bad_shards), bad_shards)
    assert ok == 200
    status, body = post(
        decoupled_proxy, f"/v1/AUTH_test/{MW_DATA}/x/../{SHARD}", _body(bad_shards), bad_shards
    )
    assert_json_error(status, body, 422, "invalid_name")
    # A plain GET of the same literal name is not a HAPI request: Swift answers it as it is.
    plain = raw_get(decoupled_proxy, f"/v1/AUTH_test/{MW_DATA}/x/../{SHARD}", bad_shards.token)
    assert plain == 404


def raw_get(proxy: ProxyProcess, path: str, token: str) -> int:
    """GET ``path`` as written."""
    parts = urlsplit(proxy.url)
    assert parts.hostname is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET", path, headers={"X-Auth-Token": token})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()
