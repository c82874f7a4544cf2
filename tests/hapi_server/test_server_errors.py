"""Every refusal of POST /v1/extract over real HTTP, each followed by a request that succeeds.

Errors are JSON ``{"detail": ..., "code": ...}`` with the status the issue names; the server keeps
serving afterwards. Queue-full (503) and infeasible (507) are in ``test_server_queue.py``.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile
from collections.abc import Callable, Iterator

import httpx
import pytest

from hapi_contract import RemoteStreamError
from hapi_contract.frames import FrameDecoder
from hapi_stack import RunningStack

from .conftest import DATA, MODELS, Dataset, ServerProcess, free_port, make_images, shard_bytes
from .server_helpers import (
    assert_error,
    extract,
    post,
    put_object,
    put_shard,
    solid_images,
)

OK_SHARD = "errors/ok.tar"
ARCH, SPLIT = "resnet18", 4


@pytest.fixture(scope="module")
def shards(swift_stack: RunningStack, dataset: Dataset) -> dict[str, bytes]:
    """Small valid and invalid shards for this module (uploaded once)."""
    out: dict[str, bytes] = {}
    images, labels = solid_images(3)
    out[OK_SHARD] = put_shard(swift_stack, OK_SHARD, images, labels)

    out["errors/garbage.tar"] = bytes(range(256)) * 40
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("s000000.jpg")
        info.size = len(images[0])
        tar.addfile(info, io.BytesIO(images[0]))
    out["errors/no-cls.tar"] = buffer.getvalue()
    # JPEG magic bytes, then nothing an image decoder accepts: passes the shard format check.
    not_jpeg = b"\xff\xd8\xff" + b"this is not an image " * 20
    out["errors/not-an-image.tar"] = shard_bytes([images[0], not_jpeg], [0, 1])
    # A valid JPEG header whose body is cut: the size check passes, the decode fails later.
    rich, _ = make_images(1, seed=5)
    out["errors/truncated-jpeg.tar"] = shard_bytes(
        [images[0], rich[0][: len(rich[0]) // 2]], [0, 1]
    )
    for name, data in out.items():
        if name != OK_SHARD:
            put_object(swift_stack, name, data)
    # Not safetensors, but named with its true sha256: the checksum passes, loading must not.
    junk = b'{"not": "safetensors"}' * 10
    put_object(swift_stack, "junk.safetensors", junk, container=MODELS)
    return out


def ok_body(dataset: Dataset, **extra: object) -> dict[str, object]:
    return dataset.request(ARCH, OK_SHARD, SPLIT, **extra)


def assert_serves(server: ServerProcess, dataset: Dataset) -> None:
    """The server still answers a valid request completely."""
    got = extract(server, dataset, ok_body(dataset))
    assert got.end.samples == 3 and got.labels == [0, 1, 2]


@pytest.fixture
def served(
    hapi_server: ServerProcess, dataset: Dataset, shards: dict[str, bytes]
) -> Iterator[ServerProcess]:
    """The session's server; after the test, it must still serve a valid request."""
    yield hapi_server
    assert_serves(hapi_server, dataset)


# --- who may ask ---------------------------------------------------------------------------


def test_no_token_is_401(served: ServerProcess, dataset: Dataset) -> None:
    resp = post(served, ok_body(dataset), {"X-Storage-Url": dataset.storage_url})
    body = assert_error(resp, 401, "unauthorized")
    assert "X-Auth-Token" in body.detail


def test_token_swift_refuses_is_401(served: ServerProcess, dataset: Dataset) -> None:
    headers = {
        "X-Auth-Token": "AUTH_tk00000000000000000000000000000000",
        "X-Storage-Url": dataset.storage_url,
    }
    body = assert_error(post(served, ok_body(dataset), headers), 401, "unauthorized")
    assert "401" in body.detail


def test_no_read_access_is_403(
    served: ServerProcess, dataset: Dataset, swift_stack: RunningStack
) -> None:
    # test2:tester2, authenticated, asks for objects in account "test" where it has no ACL.
    other = swift_stack.connection(swift_stack.other_user, swift_stack.other_key, account="test")
    try:
        _, token = other.get_auth()
    finally:
        other.close()
    headers = {"X-Auth-Token": token, "X-Storage-Url": swift_stack.account_url("test")}
    body = assert_error(post(served, ok_body(dataset), headers), 403, "forbidden")
    assert "errors/ok.tar" in body.detail or "safetensors" in body.detail


def test_missing_storage_url_is_422(served: ServerProcess, dataset: Dataset) -> None:
    resp = post(served, ok_body(dataset), {"X-Auth-Token": dataset.token})
    assert_error(resp, 422, "invalid_request")


# --- SSRF guard ----------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket that no request may ever reach."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


@pytest.mark.parametrize(
    "make_url",
    [
        lambda proxy, other: f"http://127.0.0.1:{other}/v1/AUTH_test",
        lambda proxy, other: "http://169.254.169.254/v1/AUTH_test",
        lambda proxy, other: proxy.replace("http://", "http://user@") + "/v1/AUTH_test",
        lambda proxy, other: f"{proxy}@127.0.0.1:{other}/v1/AUTH_test",
        lambda proxy, other: proxy.replace("http://", "https://") + "/v1/AUTH_test",
        lambda proxy, other: f"{proxy}/v1/AUTH_test/../../elsewhere",
        lambda proxy, other: f"{proxy}/auth/v1.0",
    ],
    ids=["other-port", "metadata-ip", "userinfo", "at-trick", "scheme", "dotdot", "not-account"],
)
def test_storage_url_off_our_swift_is_422(
    make_url: Callable[[str, int], str],
    served: ServerProcess,
    dataset: Dataset,
    swift_stack: RunningStack,
    listener: socket.socket,
) -> None:
    other_port = listener.getsockname()[1]
    url = make_url(swift_stack.proxy_url, other_port)
    resp = post(served, ok_body(dataset), {"X-Auth-Token": dataset.token, "X-Storage-Url": url})
    body = assert_error(resp, 422, "invalid_request")
    assert "X-Storage-Url" in body.detail
    with pytest.raises(BlockingIOError):
        listener.accept()  # the server never connected anywhere else


# --- what is asked for ---------------------------------------------------------------------


def test_missing_shard_is_404(served: ServerProcess, dataset: Dataset) -> None:
    body = dataset.request(ARCH, "errors/no-such-shard.tar", SPLIT)
    err = assert_error(post(served, body, dataset.headers()), 404, "not_found")
    assert "no-such-shard.tar" in err.detail


def test_missing_weights_is_404(served: ServerProcess, dataset: Dataset) -> None:
    body = ok_body(dataset)
    model = dict(body["model"])  # type: ignore[call-overload]
    model["weights"] = {**model["weights"], "object": "no-such-weights.safetensors"}
    body["model"] = model
    err = assert_error(post(served, body, dataset.headers()), 404, "not_found")
    assert "no-such-weights.safetensors" in err.detail


def test_split_index_out_of_range_is_422(served: ServerProcess, dataset: Dataset) -> None:
    err = assert_error(
        post(served, ok_body(dataset, split_index=15), dataset.headers()), 422, "invalid_request"
    )
    assert "split_index 15" in err.detail and "[0, 14]" in err.detail


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"b_max": "16"}, "b_max"),
        ({"b_max": 0}, "b_max"),
        ({"split_index": -1}, "split_index"),
        ({"bogus": 1}, "bogus"),
        ({"model": {"arch": "no_such_arch", "num_classes": 3}}, None),
        (
            {"transform": {"resize": 64, "crop": 128, "mean": [0, 0, 0], "std": [1, 1, 1]}},
            "transform",
        ),
        ({"shard": None}, "shard"),
    ],
    ids=[
        "string-int",
        "zero-b_max",
        "negative-split",
        "unknown-field",
        "unknown-arch",
        "crop",
        "null",
    ],
)
def test_invalid_schema_is_422(
    change: dict[str, object], where: str | None, served: ServerProcess, dataset: Dataset
) -> None:
    body = {**ok_body(dataset), **change}
    err = assert_error(post(served, body, dataset.headers()), 422, "invalid_request")
    if where is not None:
        assert where in err.detail


def test_unknown_path_and_method_get_the_same_json_shape(served: ServerProcess) -> None:
    assert_error(httpx.get(f"{served.url}/v1/nope"), 404, "not_found")
    err = assert_error(httpx.get(f"{served.url}/v1/extract"), 405, "method_not_allowed")
    assert "POST" in httpx.get(f"{served.url}/v1/extract").headers["allow"]
    assert err.detail


def test_body_not_json_is_422(served: ServerProcess, dataset: Dataset) -> None:
    resp = httpx.post(
        f"{served.url}/v1/extract",
        content=b"{not json",
        headers={**dataset.headers(), "Content-Type": "application/json"},
    )
    assert_error(resp, 422, "invalid_request")


def test_sha256_mismatch_is_409(served: ServerProcess, dataset: Dataset) -> None:
    body = ok_body(dataset)
    model = dict(body["model"])  # type: ignore[call-overload]
    model["weights"] = {**model["weights"], "sha256": "0" * 64}
    body["model"] = model
    err = assert_error(post(served, body, dataset.headers()), 409, "sha256_mismatch")
    assert "0" * 64 in err.detail and dataset.weights[ARCH][1] in err.detail


def test_weights_that_are_not_safetensors_are_422(served: ServerProcess, dataset: Dataset) -> None:
    import hapi_models

    junk = b'{"not": "safetensors"}' * 10
    body = ok_body(dataset)
    body["model"] = {
        "arch": ARCH,
        "num_classes": 3,
        "weights": {
            "container": MODELS,
            "object": "junk.safetensors",
            "sha256": hapi_models.sha256_hex(junk),
        },
    }
    err = assert_error(post(served, body, dataset.headers()), 422, "invalid_request")
    assert "junk.safetensors" in err.detail


@pytest.mark.parametrize(
    ("shard", "words"),
    [
        ("errors/garbage.tar", "not a tar archive"),
        ("errors/no-cls.tar", "missing .cls"),
        ("errors/not-an-image.tar", "not a decodable image"),
    ],
)
def test_invalid_shard_is_422(
    shard: str, words: str, served: ServerProcess, dataset: Dataset
) -> None:
    err = assert_error(
        post(served, dataset.request(ARCH, shard, SPLIT), dataset.headers()), 422, "invalid_shard"
    )
    assert words in err.detail and shard in err.detail


def test_image_that_fails_to_decode_mid_stream_ends_with_an_error_frame(
    served: ServerProcess, dataset: Dataset
) -> None:
    """The header of the cut JPEG is fine, so the 200 goes out; the decode fails later."""
    body = dataset.request(ARCH, "errors/truncated-jpeg.tar", SPLIT, b_max=1)
    decoder = FrameDecoder()
    with httpx.stream(
        "POST", f"{served.url}/v1/extract", json=body, headers=dataset.headers(), timeout=120
    ) as resp:
        assert resp.status_code == 200
        with pytest.raises(RemoteStreamError) as info:
            for chunk in resp.iter_bytes():
                decoder.feed(chunk)
    assert info.value.status == 422
    assert decoder.samples == 1  # the first (good) image arrived before the error frame
    # The error names the shard object and the cut image's key (issue 28, case 6).
    detail = info.value.detail
    assert f"shard {DATA}/errors/truncated-jpeg.tar: sample s000001: " in detail, detail
    assert "truncated" in detail


# --- limits --------------------------------------------------------------------------------

LIMITS = {
    "max_object_bytes": 32 * 1024,
    "max_image_pixels": 48 * 48,
    "max_samples_per_request": 4,
    "max_request_body_bytes": 2048,
}


@pytest.fixture(scope="module")
def limits_server(
    server_factory: Callable[..., ServerProcess],
    swift_stack: RunningStack,
    shards: dict[str, bytes],
) -> ServerProcess:
    big = shard_bytes(*make_images(20, seed=11))
    assert len(big) > LIMITS["max_object_bytes"]
    put_object(swift_stack, "limits/big-object.tar", big)
    put_shard(swift_stack, "limits/big-image.tar", *solid_images(1, side=64))
    put_shard(swift_stack, "limits/five.tar", *solid_images(5))
    assert len(shards[OK_SHARD]) <= LIMITS["max_object_bytes"]
    return server_factory(**LIMITS)


@pytest.fixture
def limited(limits_server: ServerProcess, dataset: Dataset) -> Iterator[ServerProcess]:
    yield limits_server
    assert_serves(limits_server, dataset)


@pytest.mark.slow  # starts its own server
def test_object_over_the_size_limit_is_413(limited: ServerProcess, dataset: Dataset) -> None:
    body = dataset.request(ARCH, "limits/big-object.tar", SPLIT)
    err = assert_error(post(limited, body, dataset.headers()), 413, "too_large")
    assert str(LIMITS["max_object_bytes"]) in err.detail


@pytest.mark.slow  # starts its own server
def test_image_over_the_pixel_limit_is_413(limited: ServerProcess, dataset: Dataset) -> None:
    body = dataset.request(ARCH, "limits/big-image.tar", SPLIT)
    err = assert_error(post(limited, body, dataset.headers()), 413, "too_large")
    assert "4096 pixels" in err.detail and str(LIMITS["max_image_pixels"]) in err.detail


@pytest.mark.slow  # starts its own server
def test_too_many_samples_is_413(limited: ServerProcess, dataset: Dataset) -> None:
    body = dataset.request(ARCH, "limits/five.tar", SPLIT)
    err = assert_error(post(limited, body, dataset.headers()), 413, "too_large")
    assert "more than 4 samples" in err.detail


def _big_body(dataset: Dataset) -> bytes:
    profile = {
        "input_shape": [3, 64, 64],
        "output_bytes_per_sample": [123456] * 14,
        "activation_bytes_per_sample": [123456] * 14,
        "weight_bytes": 1,
    }
    body = json.dumps(ok_body(dataset, profile=profile, request_id="x" * 128)).encode()
    body += b" " * 2048  # JSON allows trailing whitespace: still a valid request
    assert len(body) > LIMITS["max_request_body_bytes"]
    return body


@pytest.mark.slow  # starts its own server
def test_request_body_over_the_limit_is_413(limited: ServerProcess, dataset: Dataset) -> None:
    resp = httpx.post(
        f"{limited.url}/v1/extract",
        content=_big_body(dataset),
        headers={**dataset.headers(), "Content-Type": "application/json"},
    )
    err = assert_error(resp, 413, "too_large")
    assert "2048" in err.detail


@pytest.mark.slow  # starts its own server
def test_chunked_request_body_over_the_limit_is_413(
    limited: ServerProcess, dataset: Dataset
) -> None:
    """No Content-Length to check up front: the limit must hold on the bytes as they arrive."""
    data = _big_body(dataset)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), 512):
            yield data[i : i + 512]

    resp = httpx.post(
        f"{limited.url}/v1/extract",
        content=chunks(),
        headers={**dataset.headers(), "Content-Type": "application/json"},
    )
    assert "content-length" not in resp.request.headers
    assert resp.request.headers["transfer-encoding"] == "chunked"
    err = assert_error(resp, 413, "too_large")
    assert "2048" in err.detail


@pytest.mark.slow  # starts its own server
def test_small_chunked_body_is_served(limited: ServerProcess, dataset: Dataset) -> None:
    data = json.dumps(ok_body(dataset)).encode()
    resp = httpx.post(
        f"{limited.url}/v1/extract",
        content=iter([data[:100], data[100:]]),
        headers={**dataset.headers(), "Content-Type": "application/json"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    decoder = FrameDecoder()
    decoder.feed(resp.content)
    assert decoder.close().samples == 3


# --- Swift down ----------------------------------------------------------------------------


@pytest.mark.slow  # starts its own server
def test_swift_down_is_502_and_healthz_503(
    server_factory: Callable[..., ServerProcess], dataset: Dataset
) -> None:
    closed = free_port()  # nothing listens there
    swift_url = f"http://127.0.0.1:{closed}"
    server = server_factory(ready_status=503, swift_url=swift_url)
    health = httpx.get(f"{server.url}/healthz", timeout=10)
    assert health.status_code == 503
    assert health.json()["swift"] is False and health.json()["status"] == "degraded"
    headers = {"X-Auth-Token": dataset.token, "X-Storage-Url": f"{swift_url}/v1/AUTH_test"}
    for _ in range(2):  # and again: the server survives it
        err = assert_error(post(server, ok_body(dataset), headers), 502, "swift_unavailable")
        assert swift_url in err.detail
    assert httpx.get(f"{server.url}/healthz", timeout=10).json()["status"] == "degraded"
    server.stop()
