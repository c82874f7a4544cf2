"""``POST /v1/timings`` over real HTTP: measured per-layer costs, kept once settled, and refused
like extract."""

from __future__ import annotations

import httpx
from hapi_models import MIN_TIMED_SAMPLES

from hapi_contract import TimingsResponse
from hapi_core.timing_cache import SETTLE_MEASUREMENTS

from .conftest import Dataset, ServerProcess
from .server_helpers import assert_error

SHARD = "shards/shard-000000.tar"


def timings(server: ServerProcess, body: object, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/timings", json=body, headers=headers, timeout=120)


def test_times_every_layer_and_caches_them(hapi_server: ServerProcess, dataset: Dataset) -> None:
    body = dataset.request(
        "alexnet", SHARD, 8, samples=4, output_dtype="float32", compression="none"
    )
    first = timings(hapi_server, body, dataset.headers())
    assert first.status_code == 200, first.text
    got = TimingsResponse.model_validate_json(first.content)
    # A head whose warm-up says it is heavy (a loaded host) is timed over fewer images.
    assert MIN_TIMED_SAMPLES <= got.samples <= 4
    assert got.arch == "alexnet" and got.device == "cpu"
    assert len(got.layer_s_per_sample) == 8
    assert all(t > 0 for t in got.layer_s_per_sample) and got.decode_s_per_sample > 0
    # float32 frames: the tensor's own bytes (conv1 of AlexNet at 64 px) and a small header.
    assert 64 * 15 * 15 * 4 <= got.wire_bytes_per_sample[0] < 64 * 15 * 15 * 4 * 1.05
    # Measured again until SETTLE_MEASUREMENTS measurements, each answer the fastest seen so
    # far; then answered from the kept timings.
    answers = [got] + [
        TimingsResponse.model_validate_json(timings(hapi_server, body, dataset.headers()).content)
        for _ in range(SETTLE_MEASUREMENTS)
    ]
    assert [a.cached for a in answers] == [False] * SETTLE_MEASUREMENTS + [True]
    for earlier, later in zip(answers, answers[1:], strict=False):
        assert all(
            b <= a
            for a, b in zip(earlier.layer_s_per_sample, later.layer_s_per_sample, strict=True)
        )
    settled, last = answers[-1], answers[-2]
    # Answered from the kept timings, the head not run again: another measurement would not
    # repeat every encoding time to the last bit.
    assert settled.layer_s_per_sample == last.layer_s_per_sample
    assert settled.encode_s_per_sample == last.encode_s_per_sample
    assert settled.wire_bytes_per_sample == last.wire_bytes_per_sample
    # Fewer layers (an earlier freeze index) come from the same measurements.
    fewer = TimingsResponse.model_validate_json(
        timings(hapi_server, {**body, "split_index": 4}, dataset.headers()).content
    )
    assert fewer.cached and fewer.encode_s_per_sample == last.encode_s_per_sample[:4]
    # The wire sizes follow the dtype: float16 halves the tensor bytes, so another wire format
    # is measured, not answered from float32's.
    half = TimingsResponse.model_validate_json(
        timings(hapi_server, {**body, "output_dtype": "float16"}, dataset.headers()).content
    )
    assert not half.cached
    assert half.wire_bytes_per_sample[0] < 0.6 * got.wire_bytes_per_sample[0]


def test_refused_like_an_extract_request(hapi_server: ServerProcess, dataset: Dataset) -> None:
    body = dataset.request("alexnet", SHARD, 8)
    assert_error(
        timings(hapi_server, {**body, "samples": 0}, dataset.headers()), 422, "invalid_request"
    )
    assert_error(
        timings(hapi_server, {**body, "split_index": 99}, dataset.headers()), 422, "invalid_request"
    )
    assert_error(timings(hapi_server, body, {}), 401, "unauthorized")
    missing = {**body, "shard": "shards/none.tar"}
    assert timings(hapi_server, missing, dataset.headers()).status_code == 404
    ok = timings(hapi_server, body, dataset.headers())
    assert ok.status_code == 200, ok.text
