"""The filter in a real Swift proxy, forwarding to a real HAPI server, under tempauth and ACLs."""

from __future__ import annotations

import json

import hapi_models
import httpx
import pytest
import torch
from swiftclient.client import Connection

from hapi_stack import RunningStack
from tests.swift_middleware.mw_support import (
    HAPI,
    IMAGE_SIDE,
    MW_DATA,
    MW_MODELS,
    SHARD,
    SHARD_META,
    MwData,
    ProxyProcess,
    extract,
    shard_url,
)

pytestmark = pytest.mark.swift


def local_features(data: MwData, conn: Connection, arch: str, split: int) -> torch.Tensor:
    obj, sha = data.weights[arch]
    _, blob = conn.get_object(MW_MODELS, obj)
    model = hapi_models.get_model(arch, num_classes=3, weights=blob, sha256=sha)
    transform = hapi_models.InputTransform(resize=IMAGE_SIDE, crop=IMAGE_SIDE)
    with torch.inference_mode():
        return model.head(split)(transform.decode_batch(data.images))


def object_state(conn: Connection, container: str = MW_DATA, obj: str = SHARD) -> dict[str, str]:
    """What a HAPI request must never change: metadata, etag, timestamps, content type."""
    headers = conn.head_object(container, obj)
    kept = ("etag", "last-modified", "x-timestamp", "content-type", "content-length")
    return {k: v for k, v in headers.items() if k in kept or k.startswith("x-object-meta-")}


def test_the_owner_gets_features_through_swift(
    decoupled_proxy: ProxyProcess, mw_data: MwData, swift_conn: Connection
) -> None:
    body = mw_data.body("alexnet", 3, output_dtype="float32")  # compared to float32 local ones
    got = extract(shard_url(decoupled_proxy), body, mw_data.headers())
    assert got.status == 200, got.body
    assert got.headers["content-type"].startswith("application/x-hapi-frames")
    assert got.headers["x-hapi-execution"] == "decoupled"
    assert got.headers["x-trans-id"].startswith("tx")  # answered by Swift's proxy
    assert got.end is not None and got.end.samples == len(mw_data.images)
    assert got.labels() == mw_data.labels
    expected = local_features(mw_data, swift_conn, "alexnet", 3)
    torch.testing.assert_close(got.features(), expected, rtol=1e-4, atol=1e-5)


def test_the_full_server_body_works_as_well(decoupled_proxy: ProxyProcess, mw_data: MwData) -> None:
    # The same body a client sends to the HAPI server's /v1/extract, container and shard included.
    body = {**mw_data.body("resnet18", 4), "container": MW_DATA, "shard": SHARD}
    headers = {"X-Auth-Token": mw_data.token, "Content-Type": "application/x-hapi-request+json"}
    got = extract(shard_url(decoupled_proxy), body, headers)
    assert got.status == 200, got.body
    assert got.end is not None and got.end.samples == len(mw_data.images)


def test_acl_decides_for_another_accounts_user(
    decoupled_proxy: ProxyProcess, mw_data: MwData, swift_conn: Connection
) -> None:
    url, body = shard_url(decoupled_proxy), mw_data.body("alexnet", 3)
    denied = extract(url, body, mw_data.headers(mw_data.other_token))
    assert denied.status == 403
    assert json.loads(denied.body)["code"] == "forbidden"
    # tempauth ACLs name a user as <account>:<user>; the weights need the grant too, since the
    # HAPI server reads them as the caller.
    for container in (MW_DATA, MW_MODELS):
        swift_conn.post_container(container, {"X-Container-Read": "test2:tester2"})
    try:
        allowed = extract(url, body, mw_data.headers(mw_data.other_token))
        assert allowed.status == 200, allowed.body
        assert allowed.end is not None and allowed.end.samples == len(mw_data.images)
        # Only the shard's container granted: the filter lets the request through, the HAPI
        # server's read of the weights as the caller is refused.
        swift_conn.post_container(MW_MODELS, {"X-Remove-Container-Read": "x"})
        weights_denied = extract(url, body, mw_data.headers(mw_data.other_token))
        assert weights_denied.status == 403
    finally:
        for container in (MW_DATA, MW_MODELS):
            swift_conn.post_container(container, {"X-Remove-Container-Read": "x"})


def test_no_token_is_a_401_and_a_bad_token_too(
    decoupled_proxy: ProxyProcess, mw_data: MwData
) -> None:
    url, body = shard_url(decoupled_proxy), mw_data.body("alexnet", 3)
    anonymous = extract(url, body, HAPI)
    assert anonymous.status == 401
    assert json.loads(anonymous.body)["code"] == "unauthorized"
    assert extract(url, body, {**HAPI, "X-Auth-Token": "AUTH_tknope"}).status == 401


def test_a_missing_shard_is_a_404(decoupled_proxy: ProxyProcess, mw_data: MwData) -> None:
    got = extract(
        shard_url(decoupled_proxy, obj="shards/none.tar"),
        mw_data.body("alexnet", 3),
        mw_data.headers(),
    )
    assert got.status == 404
    assert json.loads(got.body)["code"] == "not_found"


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"),
    [
        (b"{not json", {}, 400, "bad_hapi_request"),
        (b"[]", {}, 400, "bad_hapi_request"),
        (b'{"container": "elsewhere"}', {}, 400, "path_mismatch"),
        (b"{}", {"X-Hapi-Request": "train"}, 400, "bad_hapi_request"),
        (b"{}", {"Range": "bytes=0-9"}, 400, "bad_hapi_request"),
        (b"{}", {"Content-Type": "image/png"}, 415, "unsupported_media_type"),
        (b" " * (2 * 1024 * 1024), {}, 413, "too_large"),
    ],
    ids=["not-json", "array", "mismatch", "unknown-op", "range", "media-type", "too-large"],
)
def test_malformed_requests_get_a_4xx_from_the_filter_and_leave_the_object_alone(
    decoupled_proxy: ProxyProcess,
    mw_data: MwData,
    swift_conn: Connection,
    content: bytes,
    headers: dict[str, str],
    status: int,
    code: str,
) -> None:
    before = object_state(swift_conn)
    resp = httpx.post(
        shard_url(decoupled_proxy),
        content=content,
        headers={**mw_data.headers(), **headers},
        timeout=60,
    )
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    assert resp.json()["code"] == code
    assert object_state(swift_conn) == before


def test_a_schema_error_is_the_hapi_servers_422_passed_on(
    decoupled_proxy: ProxyProcess, mw_data: MwData
) -> None:
    body = mw_data.body("alexnet", 3, b_max="many")
    got = extract(shard_url(decoupled_proxy), body, mw_data.headers())
    assert got.status == 422
    assert "b_max" in json.loads(got.body)["detail"]


def test_a_get_with_the_hapi_header_is_refused_not_served(
    decoupled_proxy: ProxyProcess, mw_data: MwData
) -> None:
    resp = httpx.get(shard_url(decoupled_proxy), headers=mw_data.headers(), timeout=30)
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"


def test_hapi_requests_never_touch_object_metadata(
    decoupled_proxy: ProxyProcess, mw_data: MwData, swift_conn: Connection
) -> None:
    before = object_state(swift_conn)
    assert {k.lower(): v for k, v in SHARD_META.items()}.items() <= before.items()
    sneaky = {**mw_data.headers(), "X-Object-Meta-Colour": "red", "X-Object-Meta-New": "1"}
    url = shard_url(decoupled_proxy)
    assert extract(url, mw_data.body("alexnet", 3), sneaky).status == 200
    assert extract(url, mw_data.body("alexnet", 3), {**HAPI, "X-Object-Meta-A": "b"}).status == 401
    assert extract(url, {"split_index": "x"}, sneaky).status == 422
    assert object_state(swift_conn) == before


def test_ordinary_requests_behave_as_without_the_filter(
    decoupled_proxy: ProxyProcess, mw_data: MwData, swift_stack: RunningStack
) -> None:
    token = mw_data.token
    container = "hapi-mw-plain"
    results = {}
    for name, base in (("plain", swift_stack.proxy_url), ("filtered", decoupled_proxy.url)):
        account = f"{base}/v1/AUTH_test"
        obj = f"{account}/{container}/o-{name}"
        auth = {"X-Auth-Token": token}
        with httpx.Client(timeout=30) as http:
            put_c = http.put(f"{account}/{container}", headers=auth).status_code
            put = http.put(obj, content=b"hello", headers={**auth, "X-Object-Meta-A": "1"})
            post = http.post(obj, headers={**auth, "X-Object-Meta-B": "2"})
            head = http.head(obj, headers=auth)
            get = http.get(obj, headers=auth)
            listing = http.get(f"{account}/{container}?format=json", headers=auth)
            accounts = http.get(f"{account}?format=json", headers=auth)
            anonymous = http.get(obj)
        results[name] = {
            "put_container": put_c in (201, 202),
            "put": (put.status_code, put.headers["etag"]),
            "post": post.status_code,
            "head": (
                head.status_code,
                head.headers.get("x-object-meta-a"),
                head.headers.get("x-object-meta-b"),
                head.headers["content-length"],
            ),
            "get": (get.status_code, get.content),
            "listed": f"o-{name}" in [o["name"] for o in listing.json()],
            "account_lists_container": container in [c["name"] for c in accounts.json()],
            "anonymous": anonymous.status_code,
        }
    assert results["plain"] == results["filtered"]
    assert results["filtered"]["post"] == 202
    assert results["filtered"]["head"] == (200, None, "2", "5")  # POST replaced the metadata
    assert results["filtered"]["get"] == (200, b"hello")


def test_every_hapi_server_down_is_a_clear_503(down_proxy: ProxyProcess, mw_data: MwData) -> None:
    got = extract(shard_url(down_proxy), mw_data.body("alexnet", 3), mw_data.headers())
    assert got.status == 503
    answer = json.loads(got.body)
    assert answer["code"] == "no_hapi_server"
    assert "no HAPI server is available" in answer["detail"]
    assert int(got.headers["retry-after"]) >= 1
    # Authorisation still comes first: no token is a 401, not a 503.
    assert extract(shard_url(down_proxy), mw_data.body("alexnet", 3), HAPI).status == 401


def test_info_advertises_hapi(decoupled_proxy: ProxyProcess) -> None:
    info = httpx.get(f"{decoupled_proxy.url}/info", timeout=30).json()
    assert info["hapi"]["execution"] == "decoupled"
    assert info["hapi"]["request_header"] == "X-Hapi-Request"
    assert "hapi_servers" not in info["hapi"]


@pytest.mark.parametrize("execution", ["decoupled", "in_proxy"])
def test_a_hapi_content_type_post_to_a_container_or_account_is_swifts_metadata_update(
    execution: str,
    mw_data: MwData,
    swift_stack: RunningStack,
    request: pytest.FixtureRequest,
) -> None:
    """Issue 19, point 7: the filter acts on object URLs only. A POST with the HAPI request's
    content type to a container or an account is Swift's metadata update, answered by Swift
    exactly as without the filter (204), not a 400 from the filter."""
    proxy: ProxyProcess = request.getfixturevalue(f"{execution}_proxy")
    container = f"hapi-mw-post-{execution.replace('_', '-')}"
    body = json.dumps({**mw_data.body("alexnet", 3), "container": container, "shard": SHARD})
    hapi_type = {"Content-Type": "application/x-hapi-request+json"}
    auth = {"X-Auth-Token": mw_data.token}
    key = f"X-Account-Meta-Hapi-Post-{execution.replace('_', '-')}"  # no "_" in a header
    seen = {}
    with httpx.Client(timeout=60) as http:
        for name, base in (("plain", swift_stack.proxy_url), ("filtered", proxy.url)):
            account = f"{base}/v1/AUTH_test"
            assert http.put(f"{account}/{container}", headers=auth).status_code in (201, 202)
            set_c = http.post(
                f"{account}/{container}",
                content=body,
                headers={**auth, **hapi_type, "X-Container-Meta-Via": name},
            )
            head_c = http.head(f"{account}/{container}", headers=auth)
            set_a = http.post(account, content=body, headers={**auth, **hapi_type, key: name})
            head_a = http.head(account, headers=auth)
            removed = http.post(account, headers={**auth, **hapi_type, key: ""})
            gone = key.lower() not in http.head(account, headers=auth).headers
            seen[name] = {
                "container": (set_c.status_code, set_c.headers.get("content-type", "")),
                "container_meta": head_c.headers.get("x-container-meta-via"),
                "account": (set_a.status_code, set_a.headers.get("content-type", "")),
                "account_meta": head_a.headers.get(key.lower()),
                "removed": (removed.status_code, gone),
                "answered_by_swift": set_c.headers["x-trans-id"].startswith("tx")
                and set_a.headers["x-trans-id"].startswith("tx"),
                "not_the_filter": "code" not in set_c.text and "code" not in set_a.text,
            }
    assert seen["filtered"]["container"][0] == 204, seen
    assert seen["filtered"]["account"][0] == 204, seen
    assert seen["filtered"]["container_meta"] == "filtered"  # the metadata update took place
    assert seen["filtered"]["account_meta"] == "filtered"
    assert seen["filtered"]["removed"] == (204, True)
    assert seen["filtered"]["answered_by_swift"] and seen["filtered"]["not_the_filter"]
    # Everything else as without the filter (the metadata values are each run's own).
    for name in seen:
        seen[name].pop("container_meta")
        seen[name].pop("account_meta")
    assert seen["plain"] == seen["filtered"]
    # An object URL with the same content type is still a HAPI request (the filter's answer).
    obj = httpx.post(
        f"{proxy.account_url()}/{container}/none.tar", content=body, headers={**auth, **hapi_type}
    )
    assert obj.status_code == 400 and obj.json()["code"] == "path_mismatch"
