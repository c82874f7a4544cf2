"""``execution = in_proxy``: the extraction runs inside the real proxy, in its thread pool."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import torch

from hapi_contract.frames import BatchFrame, EndFrame, FrameDecoder
from tests.swift_middleware.mw_support import HAPI, MwData, ProxyProcess, extract, shard_url

pytestmark = pytest.mark.swift


@pytest.mark.parametrize(("arch", "split"), [("alexnet", 6), ("resnet18", 5)])
def test_in_proxy_returns_the_features_of_the_decoupled_server(
    arch: str,
    split: int,
    in_proxy_proxy: ProxyProcess,
    decoupled_proxy: ProxyProcess,
    mw_data: MwData,
) -> None:
    # float32: two processes may sum in another order, and a 16-bit rounding would magnify that.
    body = mw_data.body(arch, split, output_dtype="float32")
    inside = extract(shard_url(in_proxy_proxy), body, mw_data.headers())
    server = extract(shard_url(decoupled_proxy), body, mw_data.headers())
    assert (inside.status, server.status) == (200, 200), (inside.body, server.body)
    assert inside.headers["x-hapi-execution"] == "in_proxy"
    assert inside.headers["content-type"].startswith("application/x-hapi-frames")
    assert inside.labels() == server.labels() == mw_data.labels
    assert inside.features().shape == server.features().shape
    torch.testing.assert_close(inside.features(), server.features(), rtol=1e-4, atol=1e-5)
    assert inside.end is not None and inside.end.meta["execution"] == "in_proxy"
    assert sum(inside.end.meta["cos_batch_sizes"]) == len(mw_data.images)
    assert max(inside.end.meta["cos_batch_sizes"]) <= body["b_max"]


def test_in_proxy_streams_float16_zstd_frames(
    in_proxy_proxy: ProxyProcess, mw_data: MwData
) -> None:
    body = mw_data.body("resnet18", 4, output_dtype="float16", compression="zstd")
    got = extract(shard_url(in_proxy_proxy), body, mw_data.headers())
    assert got.status == 200, got.body
    assert got.frames[0].features.dtype == torch.float16
    assert got.end is not None and got.end.samples == len(mw_data.images)


def test_in_proxy_authorises_as_the_caller(in_proxy_proxy: ProxyProcess, mw_data: MwData) -> None:
    url, body = shard_url(in_proxy_proxy), mw_data.body("alexnet", 3)
    assert extract(url, body, HAPI).status == 401
    assert extract(url, body, mw_data.headers(mw_data.other_token)).status == 403


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"split_index": "three"}, 422, "invalid_request"),
        ({"split_index": 99}, 422, "invalid_request"),
        ({"model": {"arch": "nonet", "num_classes": 3}}, 422, "invalid_request"),
        ({"model": {"arch": "alexnet", "num_classes": 3}}, 422, "invalid_request"),
    ],
    ids=["type", "split-range", "arch", "no-weights"],
)
def test_in_proxy_refuses_bad_requests_with_a_json_422(
    in_proxy_proxy: ProxyProcess, mw_data: MwData, change: dict[str, object], status: int, code: str
) -> None:
    body = {**mw_data.body("alexnet", 3), **change}
    got = extract(shard_url(in_proxy_proxy), body, mw_data.headers())
    assert got.status == status
    answer = json.loads(got.body)
    assert answer["code"] == code and answer["detail"]


def test_in_proxy_refuses_weights_with_another_sha256(
    in_proxy_proxy: ProxyProcess, mw_data: MwData
) -> None:
    body = mw_data.body("alexnet", 3)
    body["model"]["weights"]["sha256"] = "0" * 64
    got = extract(shard_url(in_proxy_proxy), body, mw_data.headers())
    assert got.status == 409
    assert json.loads(got.body)["code"] == "sha256_mismatch"


def test_a_plain_get_is_answered_during_a_long_in_proxy_extraction(
    in_proxy_proxy: ProxyProcess, mw_data: MwData
) -> None:
    # Many small COS batches of a big input: the extraction runs for many pool round-trips.
    body = mw_data.body("resnet18", 8, side=224, b_max=1)
    events: list[str] = []
    first_batch = threading.Event()
    failure: list[BaseException] = []

    def read_stream() -> None:
        try:
            with httpx.stream(
                "POST",
                shard_url(in_proxy_proxy),
                json=body,
                headers=mw_data.headers(),
                timeout=300,
            ) as resp:
                assert resp.status_code == 200, resp.read()
                decoder = FrameDecoder()
                for chunk in resp.iter_bytes():
                    for frame in decoder.feed(chunk):
                        if isinstance(frame, BatchFrame):
                            events.append("batch")
                            first_batch.set()
                        elif isinstance(frame, EndFrame):
                            events.append("end")
                decoder.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failure.append(exc)
        finally:
            first_batch.set()

    reader = threading.Thread(target=read_stream)
    reader.start()
    try:
        assert first_batch.wait(300)
        assert not failure, failure
        get = httpx.get(
            shard_url(in_proxy_proxy), headers={"X-Auth-Token": mw_data.token}, timeout=300
        )
        events.append("get")
    finally:
        reader.join(300)
    assert not failure, failure
    assert get.status_code == 200 and len(get.content) > 0
    assert events.count("batch") == len(mw_data.images)
    # The GET went through the same proxy while the extraction still had batches to run.
    assert events.index("get") < events.index("end"), events


def test_info_says_in_proxy(in_proxy_proxy: ProxyProcess) -> None:
    assert httpx.get(f"{in_proxy_proxy.url}/info", timeout=30).json()["hapi"]["execution"] == (
        "in_proxy"
    )
