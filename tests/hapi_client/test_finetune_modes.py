"""The three modes against the real stack: equal results, cache, exactly-once, errors."""

from __future__ import annotations

import collections

import hapi_models
import pytest
import torch

from hapi_client import (
    HapiClient,
    OptimizerConfig,
    RetryPolicy,
    ServerUnavailableError,
    SwiftAccessError,
    SwiftCredentials,
)
from hapi_client.options import ExtractOptions, TrainOptions

from .conftest import ClientEnv

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
OPT = OptimizerConfig("sgd", lr=0.05, momentum=0.9)


def _manifest(env: ClientEnv, container: str | None = None):  # type: ignore[no-untyped-def]
    with env.client() as client:
        return client.manifest(container or env.train)


def _run(env: ClientEnv, mode: str, eval_container: str | None = None, **kw: object) -> object:
    with env.client() as client:
        return client.finetune(
            model=env.models["efficientnet_lite0"].name,
            container=env.train,
            mode=mode,
            train=TrainOptions.with_optimizer(OPT, batch_size=8, epochs=1, seed=3),
            extract=ExtractOptions(split="freeze", **kw),  # type: ignore[arg-type]
            transform=SMALL,
            progress=False,
            eval_container=eval_container,
        )


def test_hapi_equals_baseline(client_env: ClientEnv) -> None:
    # float32 features: equal to BASELINE's local ones up to summation order (the 16-bit
    # default rounds them; its accuracy is benchmark hapi_bench.wire_dtypes' business).
    hapi = _run(client_env, "hapi", output_dtype="float32")
    base = _run(client_env, "baseline")
    n = _manifest(client_env).num_samples
    assert hapi.history[0].samples == base.history[0].samples == n
    assert hapi.history[0].split_index == 18 and base.history[0].split_index == 0
    a, b = hapi.model.state_dict(), base.model.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    initial = hapi_models.get_model("efficientnet_lite0", num_classes=1000, weights="imagenet")
    initial.replace_classifier(3, seed=3)
    start = initial.state_dict()
    assert any(
        not torch.equal(a[k], start[k]) for k in a if k.startswith("layers.18")
    )  # conv_head trained
    assert all(torch.equal(a[k], start[k]) for k in a if k.startswith("layers.5."))  # frozen stays
    # HAPI ships features of the freeze layer, BASELINE the stored JPEG shards.
    assert hapi.history[0].bytes_received != base.history[0].bytes_received


def test_all_in_cos_matches_baseline(client_env: ClientEnv) -> None:
    cos = _run(client_env, "all_in_cos")
    base = _run(client_env, "baseline")
    for k, v in cos.model.state_dict().items():
        torch.testing.assert_close(v, base.model.state_dict()[k], rtol=1e-4, atol=1e-5, msg=k)
    assert cos.history[0].loss == pytest.approx(base.history[0].loss, rel=1e-4)


def test_feature_cache_hits_on_epoch_two(client_env: ClientEnv) -> None:
    with client_env.client() as client:
        result = client.finetune(
            model=client_env.models["efficientnet_lite0"].name,
            container=client_env.train,
            train=TrainOptions(batch_size=8, epochs=2),
            mode="hapi",
            extract=ExtractOptions(split=12),
            transform=SMALL,
            progress=False,
        )
    first, second = result.history
    manifest = _manifest(client_env)
    assert first.requests == len(manifest.shards) and first.bytes_received > 0
    assert second.requests == 0 and second.bytes_received == 0
    assert second.samples == manifest.num_samples


def test_eval_container_and_metrics(client_env: ClientEnv) -> None:
    result = _run(client_env, "hapi", eval_container=client_env.test)
    m = result.history[0]
    assert m.eval_accuracy is not None and 0.0 <= m.eval_accuracy <= 1.0
    iterations = -(-_manifest(client_env).num_samples // 8)
    assert m.iterations == iterations and m.bytes_per_iteration == m.bytes_received / iterations


def test_bad_endpoint_is_a_clear_error(client_env: ClientEnv) -> None:
    client = HapiClient(
        "http://127.0.0.1:9", client_env.credentials, retry=RetryPolicy(attempts=2, backoff_s=0.01)
    )
    with client, pytest.raises(ServerUnavailableError, match="127.0.0.1:9"):
        client.finetune(
            model=client_env.models["efficientnet_lite0"].name,
            container=client_env.train,
            extract=ExtractOptions(split="freeze"),
            transform=SMALL,
            progress=False,
        )


def test_bad_credentials_and_missing_container(client_env: ClientEnv) -> None:
    bad = SwiftCredentials(client_env.credentials.auth_url, "test:tester", "wrong")
    with (
        HapiClient(client_env.server.url, bad) as client,
        pytest.raises(SwiftAccessError, match="401"),
    ):
        client.finetune(
            model=client_env.models["efficientnet_lite0"].name, container=client_env.train
        )
    with client_env.client() as client, pytest.raises(SwiftAccessError, match="no-such-container"):
        client.finetune(
            model=client_env.models["efficientnet_lite0"].name, container="no-such-container"
        )


def test_bandwidth_estimate_never_exceeds_a_throttled_rate(client_env: ClientEnv) -> None:
    """The throttle bounds what the estimator can measure, on a machine of any speed.

    A read is timed after its first 64 KiB chunk, so in a window of t seconds at most
    ``burst + rate * t`` of the B bytes that follow can pass the bucket: each observation, and
    so their folded sums and their moving average, is at most ``rate / (1 - burst / B)``. How
    close to the rate the estimate comes depends on the machine's speed, so it is a benchmark
    figure (the e2e scenario's link rate), not an assertion here.
    """
    # A low rate keeps the burst (20 ms of traffic) well below the timed part of a shard.
    rate = 200_000.0
    with client_env.client(throttle_bytes_per_s=rate) as client:
        assert client.throttle is not None
        burst = client.throttle.burst
        manifest = client.manifest(client_env.train)
        for _ in range(2):  # enough timed bytes for one of the estimator's 256 KiB folds
            for shard in manifest.shards:
                client.swift.get(client_env.train, shard.name)
        estimate = client.bandwidth.bytes_per_s
    assert estimate is not None and client.bandwidth.observations >= 1
    timed = min(shard.bytes for shard in manifest.shards) - 64 * 1024
    assert timed > burst  # else the bound below would say nothing
    assert estimate <= rate / (1 - burst / timed), (estimate, rate, burst, timed)


def test_exactly_once_across_a_server_restart(client_env: ClientEnv) -> None:
    """Kill the HAPI server after the first shard of the epoch; the epoch still delivers every
    sample exactly once because a shard counts only with its verified end frame."""
    from tests.hapi_server.conftest import start_server

    port = int(client_env.server.url.rsplit(":", 1)[1])
    seen: list[int] = []
    with client_env.client(
        retry=RetryPolicy(attempts=30, backoff_s=0.2, max_backoff_s=1.0)
    ) as client:
        original = client.transport.extract
        state = {"restarted": False}

        def extract(req, num_samples=None):  # type: ignore[no-untyped-def]
            got = original(req, num_samples)
            seen.extend(got.labels.tolist())
            if not state["restarted"]:
                state["restarted"] = True
                client_env.server.process.kill()
                client_env.server.process.wait()
                client_env.server = start_server(
                    client_env.stack,
                    client_env.log_dir,
                    None,
                    port=port,
                    cpu_memory_budget_bytes=3 * 2**30,
                    b_min=4,
                )
            return got

        client.transport.extract = extract  # type: ignore[method-assign]
        result = client.finetune(
            model=client_env.models["efficientnet_lite0"].name,
            container=client_env.train,
            train=TrainOptions(batch_size=8),
            mode="hapi",
            extract=ExtractOptions(split=10, cache_features=False, prefetch=2),
            transform=SMALL,
            progress=False,
        )
    assert result.history[0].samples == _manifest(client_env).num_samples
    manifest_labels = collections.Counter()
    with client_env.client() as client:
        manifest = client.manifest(client_env.train)
        from hapi_contract import read_shard

        for shard in manifest.shards:
            data, _ = client.swift.get(client_env.train, shard.name)
            manifest_labels.update(s.label for s in read_shard(data))
    assert collections.Counter(seen) == manifest_labels
