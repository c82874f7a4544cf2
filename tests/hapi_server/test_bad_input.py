"""Bad and hostile input to /v1/extract and /v1/finetune: a 4xx JSON error, never a 500.

Every case runs over real HTTP against a real server reading the session's real Swift and
checks the status and the JSON ``code``; after the cases the server must still serve a valid
request. The Swift reader's URL building and its mapping of Swift's answers are unit-tested at
the end with a fake transport (the only way to get Swift answers like 412 or 429 on demand).
``test_server_errors.py`` holds the refusals that were right before (auth, schema, limits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hapi_models
import httpx
import pytest

from hapi_contract import write_shard
from hapi_core.errors import (
    ForbiddenError,
    HapiCoreError,
    InvalidNameError,
    NotFoundError,
    PayloadTooLargeError,
    StorageRefusedError,
    StorageUnavailableError,
    UnauthorizedError,
)
from hapi_core.estimates import model_footprint
from hapi_server.all_in_cos import gather_bounded
from hapi_server.swift_io import Caller, SwiftReader
from hapi_stack import RunningStack

from .bad_inputs import NOT_JPEG, bomb_png, truncated_jpeg
from .conftest import DATA, MODELS, Dataset, ServerProcess
from .server_helpers import TIMEOUT, assert_error, extract, put_object, put_shard, solid_images

ARCH, SPLIT = "resnet18", 4
OK = "bad/ok.tar"
BOMB = "bad/bomb.tar"
BOMB_SECOND = "bad/bomb-second.tar"
TRUNCATED = "bad/truncated.tar"
NOT_AN_IMAGE = "bad/not-jpeg.tar"


def _shard(samples: list[tuple[bytes, str]]) -> bytes:
    return write_shard((f"s{i:06d}", img, ext, i % 3) for i, (img, ext) in enumerate(samples))


@pytest.fixture(scope="module")
def bad_data(swift_stack: RunningStack, dataset: Dataset) -> Dataset:
    """This module's shards (one good, several bad) in the session's data container."""
    images, labels = solid_images(3)
    put_shard(swift_stack, OK, images, labels)
    good = (images[0], "jpg")
    put_object(swift_stack, BOMB, _shard([(bomb_png(), "png")]))
    put_object(swift_stack, BOMB_SECOND, _shard([good, (bomb_png(), "png")]))
    put_object(swift_stack, TRUNCATED, _shard([good, (truncated_jpeg(), "jpg")]))
    put_object(swift_stack, NOT_AN_IMAGE, _shard([good, (NOT_JPEG, "jpg")]))
    return dataset


def ok_body(dataset: Dataset, **extra: Any) -> dict[str, Any]:
    return {**dataset.request(ARCH, OK, SPLIT), **extra}


def finetune_body(dataset: Dataset, **extra: Any) -> dict[str, Any]:
    obj, sha = dataset.weights[ARCH]
    body: dict[str, Any] = {
        "container": DATA,
        "shards": [OK],
        "model": {
            "arch": ARCH,
            "num_classes": 3,
            "weights": {"container": MODELS, "object": obj, "sha256": sha},
        },
        "freeze_index": 8,
        "transform": dataset.transform(),
        "batch_size": 4,
        "epochs": 1,
        "optimizer": {"name": "sgd", "lr": 0.01},
        "b_max": 4,
    }
    body.update(extra)
    return body


def with_weights(body: dict[str, Any], dataset: Dataset, **change: Any) -> dict[str, Any]:
    """``body`` whose model is changed: ``arch``/``num_classes``, or weights fields."""
    model = dict(body["model"])
    weights = dict(model["weights"])
    for key, value in change.items():
        if key in ("arch", "num_classes"):
            model[key] = value
        else:
            weights[key] = value
    model["weights"] = weights
    return {**body, "model": model}


def assert_serves(server: ServerProcess, dataset: Dataset) -> None:
    got = extract(server, dataset, ok_body(dataset))
    assert got.end.samples == 3 and got.labels == [0, 1, 2]


@pytest.fixture(scope="module")
def bad_server(hapi_server: ServerProcess, bad_data: Dataset) -> Iterator[ServerProcess]:
    """The session's server; once this module's cases ran, it must still serve a valid request."""
    yield hapi_server
    assert_serves(hapi_server, bad_data)


def _alexnet_weights(dataset: Dataset) -> dict[str, str]:
    obj, sha = dataset.weights["alexnet"]
    return {"object": obj, "sha256": sha}


# name -> (body change, status, code); each change is applied to a valid /v1/extract body.
EXTRACT_CASES: dict[str, tuple[Callable[[Dataset], dict[str, Any]], int, str]] = {
    "bomb-only-image": (lambda d: ok_body(d, shard=BOMB), 413, "too_large"),
    "bomb-second-image": (lambda d: ok_body(d, shard=BOMB_SECOND), 413, "too_large"),
    "not-an-image": (lambda d: ok_body(d, shard=NOT_AN_IMAGE), 422, "invalid_shard"),
    # Dot segments: before the fix, "x/../bad/ok.tar" was read as bad/ok.tar and answered 200.
    "dotdot-in-shard": (lambda d: ok_body(d, shard=f"x/../{OK}"), 422, "invalid_request"),
    "dot-first-segment": (lambda d: ok_body(d, shard=f"./{OK}"), 422, "invalid_request"),
    "dot-middle-segment": (lambda d: ok_body(d, shard="bad/./ok.tar"), 422, "invalid_request"),
    "dotdot-shard": (lambda d: ok_body(d, shard=".."), 422, "invalid_request"),
    "dotdot-last": (lambda d: ok_body(d, shard=f"{OK}/.."), 422, "invalid_request"),
    "dot-container": (lambda d: ok_body(d, container="."), 422, "invalid_request"),
    "dotdot-container": (lambda d: ok_body(d, container=".."), 422, "invalid_request"),
    "dotdot-weights": (
        lambda d: with_weights(ok_body(d), d, object=f"x/../{d.weights[ARCH][0]}"),
        422,
        "invalid_request",
    ),
    "dotdot-weights-container": (
        lambda d: with_weights(ok_body(d), d, container=".."),
        422,
        "invalid_request",
    ),
    # Weights of another model: refused from the HEAD's size, before they are read or built.
    "weights-of-another-arch": (
        lambda d: with_weights(ok_body(d), d, **_alexnet_weights(d)),
        422,
        "invalid_request",
    ),
    "weights-of-another-class-count": (
        lambda d: with_weights(ok_body(d), d, num_classes=100_000),
        422,
        "invalid_request",
    ),
    # A timm tag timm does not know: timm's RuntimeError was a 500 internal_error.
    "timm-unknown-tag": (
        lambda d: with_weights(ok_body(d), d, arch="timm/resnet18d.bad_tag"),
        422,
        "invalid_request",
    ),
    # 100000-class VGG19 has 2.2 GB of weights, over max_weights_bytes: refused before any I/O.
    "model-over-weights-limit": (
        lambda d: with_weights(ok_body(d, split_index=4), d, arch="vgg19", num_classes=100_000),
        413,
        "too_large",
    ),
}


@pytest.mark.parametrize("case", list(EXTRACT_CASES))
def test_extract_refuses_bad_input(case: str, bad_server: ServerProcess, bad_data: Dataset) -> None:
    make, status, code = EXTRACT_CASES[case]
    resp = httpx.post(
        f"{bad_server.url}/v1/extract",
        json=make(bad_data),
        headers=bad_data.headers(),
        timeout=TIMEOUT,
    )
    assert_error(resp, status, code)


@pytest.mark.parametrize("account", ["..", "."])
def test_dot_segment_account_in_storage_url_is_422(
    account: str, bad_server: ServerProcess, bad_data: Dataset, swift_stack: RunningStack
) -> None:
    headers = {
        "X-Auth-Token": bad_data.token,
        "X-Storage-Url": f"{swift_stack.proxy_url}/v1/{account}",
    }
    resp = httpx.post(
        f"{bad_server.url}/v1/extract", json=ok_body(bad_data), headers=headers, timeout=TIMEOUT
    )
    assert_error(resp, 422, "invalid_name")


FINETUNE_CASES: dict[str, tuple[Callable[[Dataset], dict[str, Any]], int, str]] = {
    "truncated-jpeg": (lambda d: finetune_body(d, shards=[TRUNCATED]), 422, "invalid_shard"),
    "garbage-after-jpeg-magic": (
        lambda d: finetune_body(d, shards=[OK, NOT_AN_IMAGE]),
        422,
        "invalid_shard",
    ),
    "bomb": (lambda d: finetune_body(d, shards=[BOMB]), 413, "too_large"),
    "bomb-in-eval": (lambda d: finetune_body(d, eval_shards=[BOMB_SECOND]), 413, "too_large"),
    "truncated-in-eval": (
        lambda d: finetune_body(d, eval_shards=[TRUNCATED]),
        422,
        "invalid_shard",
    ),
    "many-missing-shards": (
        lambda d: finetune_body(d, shards=[f"bad/missing-{i}.tar" for i in range(40)]),
        404,
        "not_found",
    ),
    "dotdot-shard": (lambda d: finetune_body(d, shards=[f"x/../{OK}"]), 422, "invalid_request"),
    "weights-of-another-arch": (
        lambda d: with_weights(finetune_body(d), d, **_alexnet_weights(d)),
        422,
        "invalid_request",
    ),
    "model-over-weights-limit": (
        lambda d: with_weights(finetune_body(d), d, arch="vgg19", num_classes=100_000),
        413,
        "too_large",
    ),
}


@pytest.mark.parametrize("case", list(FINETUNE_CASES))
def test_finetune_refuses_bad_input(
    case: str, bad_server: ServerProcess, bad_data: Dataset
) -> None:
    make, status, code = FINETUNE_CASES[case]
    resp = httpx.post(
        f"{bad_server.url}/v1/finetune",
        json=make(bad_data),
        headers=bad_data.headers(),
        timeout=TIMEOUT,
    )
    assert_error(resp, status, code)


def test_finetune_and_extract_answer_an_image_alike(
    bad_server: ServerProcess, bad_data: Dataset
) -> None:
    """One decoding/check path: the same shard gets the same status, code and detail."""
    for shard in (BOMB, NOT_AN_IMAGE):
        ex = httpx.post(
            f"{bad_server.url}/v1/extract",
            json=ok_body(bad_data, shard=shard),
            headers=bad_data.headers(),
            timeout=TIMEOUT,
        )
        ft = httpx.post(
            f"{bad_server.url}/v1/finetune",
            json=finetune_body(bad_data, shards=[shard]),
            headers=bad_data.headers(),
            timeout=TIMEOUT,
        )
        assert (ex.status_code, ex.json()) == (ft.status_code, ft.json())


@pytest.mark.parametrize("where", ["shards", "eval_shards"])
def test_finetune_names_the_image_that_does_not_decode(
    where: str, bad_server: ServerProcess, bad_data: Dataset
) -> None:
    """ALL_IN_COS names a cut image as /v1/extract does, by its shard and key (issue 28, case
    6), in the training shards and in the evaluation ones; it named a position before."""
    resp = httpx.post(
        f"{bad_server.url}/v1/finetune",
        json=finetune_body(bad_data, **{where: [TRUNCATED]}),
        headers=bad_data.headers(),
        timeout=TIMEOUT,
    )
    err = assert_error(resp, 422, "invalid_shard")
    assert f"shard {DATA}/{TRUNCATED}: sample s000001: " in err.detail, err.detail


def test_a_dot_segment_is_never_resolved_to_another_object(
    bad_server: ServerProcess, bad_data: Dataset
) -> None:
    """Before the fix, ``nope/../bad/ok.tar`` was read as ``bad/ok.tar`` (httpx resolves dot
    segments): the answer was that object's features. Now nothing is read."""
    assert_serves(bad_server, bad_data)  # the object the name would resolve to is readable
    for shard in (f"nope/../{OK}", f"bad/./{OK.split('/')[1]}"):
        resp = httpx.post(
            f"{bad_server.url}/v1/extract",
            json=ok_body(bad_data, shard=shard),
            headers=bad_data.headers(),
            timeout=TIMEOUT,
        )
        assert_error(resp, 422, "invalid_request")
        assert "content-type" in resp.headers and "frames" not in resp.headers["content-type"]


def test_finetune_still_trains_after_the_refusals(
    bad_server: ServerProcess, bad_data: Dataset
) -> None:
    resp = httpx.post(
        f"{bad_server.url}/v1/finetune",
        json=finetune_body(bad_data, eval_shards=[OK]),
        headers=bad_data.headers(),
        timeout=TIMEOUT,
    )
    assert resp.status_code == 200, resp.content[:500]
    assert hapi_models.sha256_hex(resp.content) == resp.headers["x-hapi-sha256"]
    trained = hapi_models.get_model(ARCH, num_classes=3, weights=resp.content)
    assert sum(p.numel() for p in trained.parameters()) > 0


# --- admission before the model is built ------------------------------------------------------


@pytest.fixture(scope="module")
def big_weights_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """A server that would accept 2.2 GB of weights: only the size check stands in the way."""
    return server_factory(cpu_memory_budget_bytes=8 * 2**30, max_weights_bytes=4 * 2**30)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow  # starts its own server
def test_wrong_weights_for_a_huge_model_are_refused_without_building_it(
    big_weights_server: ServerProcess,
    bad_data: Dataset,
    record_property: Callable[[str, object], None],
) -> None:
    body = with_weights(ok_body(bad_data), bad_data, arch="vgg19", num_classes=100_000)
    before = _rss(big_weights_server.process.pid)
    resp = httpx.post(
        f"{big_weights_server.url}/v1/extract",
        json=body,
        headers=bad_data.headers(),
        timeout=TIMEOUT,
    )
    # Reported, not asserted on (no timing thresholds): the issue measured 25 s and 2 GB.
    record_property("seconds", resp.elapsed.total_seconds())
    record_property("rss_before", before)
    err = assert_error(resp, 422, "invalid_request")
    assert "vgg19 with 100000 classes" in err.detail
    grown = _rss(big_weights_server.process.pid) - before
    record_property("rss_grown", grown)
    # Building the model would allocate its 2.2 GB of parameters; a tenth of that bounds what
    # the request may have cost (profiles and buffers, not the model).
    assert grown < model_footprint("vgg19", 100_000).resident_bytes // 10, grown
    assert_serves(big_weights_server, bad_data)


@pytest.mark.slow  # starts its own server
def test_a_model_larger_than_the_device_is_507_before_it_is_built(
    server_factory: Callable[..., ServerProcess], bad_data: Dataset
) -> None:
    """Loading is admitted like any other memory: weights that fit no device are refused."""
    server = server_factory(
        devices="cpu", cpu_memory_budget_bytes=32 * 2**20, framework_reserve_bytes=0, b_min=1
    )
    before = _rss(server.process.pid)
    resp = httpx.post(
        f"{server.url}/v1/extract",
        json=ok_body(bad_data),  # resnet18: 45 MB of weights, over this 32 MiB device
        headers=bad_data.headers(),
        timeout=TIMEOUT,
    )
    assert_error(resp, 507, "insufficient_memory")
    assert _rss(server.process.pid) - before < model_footprint(ARCH, 3).resident_bytes
    server.stop()


# --- unit: the Swift reader ----------------------------------------------------------------------


CALLER = Caller(token="tk", storage_url="http://swift.test/v1/AUTH_test")


def _reader(handler: Callable[[httpx.Request], httpx.Response]) -> SwiftReader:
    reader = SwiftReader("http://swift.test", timeout_s=5)
    reader._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return reader


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        (400, StorageRefusedError, 400),
        (401, UnauthorizedError, 401),
        (403, ForbiddenError, 403),
        (404, NotFoundError, 404),
        (405, StorageRefusedError, 405),
        (412, StorageRefusedError, 412),
        (413, PayloadTooLargeError, 413),
        (429, StorageRefusedError, 429),
        (500, StorageUnavailableError, 502),
        (503, StorageUnavailableError, 502),
    ],
)
def test_swift_answers_map_to_the_matching_status(
    status: int, error: type[HapiCoreError], expected: int
) -> None:
    reader = _reader(lambda _: httpx.Response(status, headers={"Retry-After": "3"}))

    async def both() -> list[BaseException]:
        out: list[BaseException] = []
        for call in (reader.head(CALLER, "c", "o"), reader.get(CALLER, "c", "o", max_bytes=10)):
            try:
                await call
            except HapiCoreError as exc:
                out.append(exc)
        await reader.aclose()
        return out

    errors = asyncio.run(both())
    assert len(errors) == 2
    for exc in errors:
        assert isinstance(exc, error) and exc.status == expected
    if status == 429:
        assert errors[0].headers == {"Retry-After": "3"}


@pytest.mark.parametrize(
    ("obj", "raw_path"),
    [
        ("a/b.tar", b"/v1/AUTH_test/c/a/b.tar"),
        ("a//b.tar", b"/v1/AUTH_test/c/a//b.tar"),
        ("a/%2E%2E/b", b"/v1/AUTH_test/c/a/%252E%252E/b"),
        ("...", b"/v1/AUTH_test/c/..."),
        ("a b?#.tar", b"/v1/AUTH_test/c/a%20b%3F%23.tar"),
    ],
)
def test_the_reader_sends_exactly_the_named_object(obj: str, raw_path: bytes) -> None:
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(200, content=b"x", headers={"etag": '"e"'})

    reader = _reader(handler)

    async def run() -> None:
        await reader.head(CALLER, "c", obj)
        await reader.get(CALLER, "c", obj, max_bytes=10)
        await reader.aclose()

    asyncio.run(run())
    assert seen == [raw_path, raw_path]


@pytest.mark.parametrize(
    ("container", "obj"),
    [("c", "a/../b"), ("c", "./b"), ("c", "b/."), ("c", ".."), ("..", "b"), (".", "b")],
)
def test_the_reader_refuses_dot_segments_and_sends_nothing(container: str, obj: str) -> None:
    seen: list[httpx.Request] = []
    reader = _reader(lambda request: seen.append(request) or httpx.Response(200))

    async def run() -> None:
        try:
            with pytest.raises(InvalidNameError):
                await reader.head(CALLER, container, obj)
            with pytest.raises(InvalidNameError):
                await reader.get(CALLER, container, obj, max_bytes=10)
        finally:
            await reader.aclose()

    asyncio.run(run())
    assert seen == []


def test_bounded_gather_keeps_to_its_limit_and_stops_at_the_first_failure() -> None:
    in_flight, peak, started = 0, 0, 0

    async def run() -> None:
        nonlocal in_flight, peak, started
        gate = asyncio.Event()

        async def missing(i: int) -> int:
            nonlocal in_flight, peak, started
            started += 1
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                if i == 2:
                    raise NotFoundError(f"shard {i} not found")
                await gate.wait()  # the others never finish on their own
                return i
            finally:
                in_flight -= 1

        with pytest.raises(NotFoundError, match="shard 2"):
            await gather_bounded([lambda i=i: missing(i) for i in range(100)], 4)
        assert in_flight == 0  # the ones still running were cancelled, not left behind

    asyncio.run(run())
    assert peak <= 4
    assert started <= 4 + 1


def test_a_weights_blob_is_its_tensors_plus_a_small_header() -> None:
    """What the size check assumes of a weights object (HAPI writes them so)."""
    model = hapi_models.get_model(ARCH, num_classes=3)
    blob = hapi_models.weights_to_bytes(model)
    fp = model_footprint(ARCH, 3)
    assert (
        fp.state_bytes + 8
        < len(blob)
        < fp.state_bytes + 8 + 256 * fp.num_tensors + fp.state_key_bytes
    )
