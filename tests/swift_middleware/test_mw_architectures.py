"""Architectures beyond the thesis' seven through the whole system (issue 20): a small CNN
(MobileNetV3-S), a transformer (timm's ViT-Ti/16) and the example plugin's ``tinycnn``
(examples/hapi-model-plugin, installed in the venv), uploaded, then fine-tuned through the real
HAPI server and the real Swift filter in both executions: HAPI at a fixed split and at
``split="auto"``, BASELINE and ALL_IN_COS, with pushdown verification and the feature cache;
and every bad request refused with a clear 422 while the others are served.

ViT-Ti/16 rather than Swin-T: Swin-T runs 64-pixel crops, yet its 110 MB of weights cost more
(to store, hash and load in every process) than ViT-Ti's 22 MB at the 224 pixels its position
embedding fixes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import hapi_models
import pytest
import torch
from swiftclient.client import Connection

from hapi_client import (
    FinetuneResult,
    HapiClient,
    OptimizerConfig,
    RetryPolicy,
    StoredModel,
    SwiftCredentials,
    upload_model,
)
from hapi_client.datasets import get_source, upload_dataset
from hapi_client.options import ExtractOptions, TrainOptions
from hapi_contract import OutputDtype
from hapi_stack import RunningStack
from tests.hapi_server.conftest import ServerProcess
from tests.swift_middleware.mw_support import HAPI, ProxyProcess, extract

pytestmark = [pytest.mark.swift, pytest.mark.slow]

TRAIN = "hapi-arch-train"
MODELS = "hapi-arch-models"
OPT = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
TRAIN_OPTIONS = TrainOptions.with_optimizer(OPT, batch_size=10, epochs=2, seed=5)
SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
VIT = "timm/vit_tiny_patch16_224"
# One shard in flight at a time: a server or proxy that cuts one network while it runs another
# fails the run (tests/hapi_models/test_graph_split_threads.py, a strict xfail until fixed).
SERIAL = 1


@dataclass(frozen=True)
class Case:
    arch: str
    transform: hapi_models.InputTransform
    split: int
    """An interior split point: a residual sum, a transformer block's output, a block's end."""


CASES = {
    "mobilenet_v3_small": Case("mobilenet_v3_small", SMALL, 13),  # after features.5.add
    VIT: Case(VIT, hapi_models.InputTransform(resize=224, crop=224), 19),  # after blocks.4
    "tinycnn": Case("tinycnn", SMALL, 8),  # after the second block
}
EXECUTIONS = ["server", "decoupled", "in_proxy"]


@dataclass
class ArchEnv:
    stack: RunningStack
    server: ServerProcess
    models: dict[str, StoredModel]
    num_samples: int
    shard: str
    baselines: dict[str, FinetuneResult]

    def credentials(self, auth_url: str | None = None) -> SwiftCredentials:
        stack = self.stack
        return SwiftCredentials(auth_url or stack.auth_url, stack.admin_user, stack.admin_key)


@pytest.fixture(scope="module")
def arch_env(swift_stack: RunningStack, mw_server: ServerProcess) -> Iterator[ArchEnv]:
    conn: Connection = swift_stack.connection()
    # 20 photos of 10 classes in two shards: two iterations of 10 per epoch.
    manifest = upload_dataset(
        conn,
        get_source("photos:train?per_class=2&size=96x72"),
        TRAIN,
        shard_size=10,
        progress=False,
    )
    models = {arch: upload_model(conn, arch, container=MODELS)[0] for arch in CASES}
    conn.close()
    yield ArchEnv(swift_stack, mw_server, models, manifest.num_samples, manifest.shards[0].name, {})


@pytest.fixture(params=EXECUTIONS)
def execution(request: pytest.FixtureRequest, arch_env: ArchEnv) -> Callable[[], HapiClient]:
    """A client of the server itself, or of a Swift proxy whose filter forwards to it
    (decoupled) or extracts in the proxy (in_proxy). ALL_IN_COS always goes to the server."""
    via = request.param
    auth_url = None
    if via != "server":
        proxy: ProxyProcess = request.getfixturevalue(f"{via}_proxy")
        auth_url = arch_env.stack.auth_url.replace(arch_env.stack.proxy_url, proxy.url)
    creds = arch_env.credentials(auth_url)

    def client() -> HapiClient:
        return HapiClient(
            arch_env.server.url,
            creds,
            via="hapi" if via == "server" else "swift",
            retry=RetryPolicy(attempts=8, backoff_s=0.2, max_backoff_s=2.0),
        )

    return client


def _finetune(
    client: HapiClient, env: ArchEnv, case: Case, mode: str, **kwargs: Any
) -> FinetuneResult:
    return client.finetune(
        model=env.models[case.arch].name,
        container=TRAIN,
        mode=mode,  # type: ignore[arg-type]
        train=kwargs.pop("train", TRAIN_OPTIONS),
        transform=case.transform,
        progress=False,
        **kwargs,
    )


def _baseline(env: ArchEnv, case: Case) -> FinetuneResult:
    """BASELINE once per architecture: every layer here, on the raw shards."""
    if case.arch not in env.baselines:
        with HapiClient(env.server.url, env.credentials()) as client:
            env.baselines[case.arch] = _finetune(client, env, case, "baseline")
    return env.baselines[case.arch]


def _assert_same_weights(got: FinetuneResult, want: FinetuneResult) -> None:
    # float32 features: equal to BASELINE's local ones up to summation order.
    theirs = want.model.state_dict()
    for key, value in got.model.state_dict().items():
        torch.testing.assert_close(value, theirs[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("arch", list(CASES))
def test_hapi_at_a_fixed_split_verifies_caches_and_equals_baseline(
    arch: str, arch_env: ArchEnv, execution: Callable[[], HapiClient]
) -> None:
    case = CASES[arch]
    with execution() as client:
        hapi = _finetune(
            client,
            arch_env,
            case,
            "hapi",
            extract=ExtractOptions(
                split=case.split, output_dtype=OutputDtype("float32"), prefetch=SERIAL
            ),
            verify_fraction=1.0,
        )
    first, second = hapi.history
    assert first.split_index == case.split == hapi.split.split_index  # type: ignore[union-attr]
    assert first.samples == second.samples == arch_env.num_samples
    # Every shard's features were recomputed here from the raw shard and matched.
    assert hapi.extra["verified_shards"] == 2
    assert hapi.extra["verified_samples"] > 0
    # The frozen split's features come from the cache in the second epoch.
    assert second.requests == 0 and second.bytes_received == 0
    assert hapi.extra["cache_hits"] > 0
    base = _baseline(arch_env, case)
    assert [m.samples for m in base.history] == [arch_env.num_samples] * 2
    _assert_same_weights(hapi, base)
    assert hapi.history[0].loss == pytest.approx(base.history[0].loss, rel=1e-4)


@pytest.mark.parametrize("arch", list(CASES))
def test_auto_split_is_planned_from_the_measured_costs(
    arch: str, arch_env: ArchEnv, execution: Callable[[], HapiClient]
) -> None:
    case = CASES[arch]
    freeze = hapi_models.get_spec(arch).default_freeze_index
    with execution() as client:
        result = _finetune(
            client,
            arch_env,
            case,
            "hapi",
            train=TRAIN_OPTIONS.replace(epochs=1),
            extract=ExtractOptions(split="auto", prefetch=SERIAL),
            verify_fraction=1.0,
        )
    decision = result.split
    assert decision is not None and decision.rule == "time", decision
    assert [t.split for t in decision.predictions] == list(range(freeze + 1))
    # Every head was timed by whichever process runs it (server or proxy).
    assert all(t.server_s > 0 for t in decision.predictions[1:])
    assert result.history[0].split_index == decision.split_index
    assert result.history[0].samples == arch_env.num_samples
    if decision.split_index > 0:  # split 0 ships the stored shards: nothing to verify
        assert result.extra["verified_samples"] > 0


@pytest.mark.parametrize("arch", list(CASES))
def test_all_in_cos_equals_baseline(arch: str, arch_env: ArchEnv) -> None:
    case = CASES[arch]
    with HapiClient(arch_env.server.url, arch_env.credentials()) as client:
        cos = _finetune(client, arch_env, case, "all_in_cos")
    base = _baseline(arch_env, case)
    _assert_same_weights(cos, base)
    assert [m.loss for m in cos.history] == pytest.approx([m.loss for m in base.history], rel=1e-4)


# Bad requests: the same 422 from the server and the filter in both executions.


def _body(
    env: ArchEnv, arch: str, split: int, model: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An extraction of the first shard with ``arch``'s stored model (``model`` changes it)."""
    case = CASES[arch]
    ref = {**env.models[arch].ref().model_dump(mode="json"), **(model or {})}
    transform = case.transform
    return {
        "container": TRAIN,
        "shard": env.shard,
        "model": ref,
        "split_index": split,
        "transform": {
            "resize": transform.resize,
            "crop": transform.crop,
            "mean": list(transform.mean),
            "std": list(transform.std),
        },
        "b_max": 5,
        "output_dtype": "float32",
    }


def _feature_shape(case: Case, batch: int) -> torch.Size:
    """The shape of a batch's features at the case's split, traced on the meta device."""
    with torch.device("meta"):
        head = hapi_models.get_model(case.arch).head(case.split)
        return head(torch.empty(batch, *case.transform.input_shape)).shape


def _url(env: ArchEnv, request: pytest.FixtureRequest, via: str) -> tuple[str, dict[str, str]]:
    conn = env.stack.connection()
    storage_url, token = conn.get_auth()
    conn.close()
    headers = {"X-Auth-Token": token, "X-Storage-Url": storage_url}
    if via == "server":
        return f"{env.server.url}/v1/extract", headers
    proxy: ProxyProcess = request.getfixturevalue(f"{via}_proxy")
    return f"{proxy.account_url()}/{TRAIN}/{env.shard}", {**HAPI, **headers}


def _bad_bodies(env: ArchEnv) -> dict[str, tuple[dict[str, Any], str]]:
    vit_layers = hapi_models.get_spec(VIT).num_layers
    tiny = env.models["tinycnn"]
    return {
        "unknown-arch": (
            _body(env, "mobilenet_v3_small", 3, {"arch": "mobilenet_v3_smal"}),
            "unknown model 'mobilenet_v3_smal'; did you mean 'mobilenet_v3_small'?",
        ),
        "unknown-timm": (
            _body(env, VIT, 3, {"arch": "timm/no_such_net"}),
            "unknown model 'timm/no_such_net'",
        ),
        "split-beyond-the-last-point": (
            _body(env, VIT, vit_layers + 1),
            f"split_index {vit_layers + 1} out of range for {VIT}: must be in [0, {vit_layers}]",
        ),
        "weights-of-another-arch": (
            _body(
                env,
                "mobilenet_v3_small",
                3,
                {"weights": {"container": MODELS, "object": tiny.object, "sha256": tiny.sha256}},
            ),
            f"weights {MODELS}/{tiny.object}",
        ),
    }


@pytest.mark.parametrize("via", EXECUTIONS)
def test_bad_requests_are_a_422_naming_the_cause_and_others_are_served(
    via: str, arch_env: ArchEnv, request: pytest.FixtureRequest
) -> None:
    url, headers = _url(arch_env, request, via)
    for what, (body, cause) in _bad_bodies(arch_env).items():
        if via != "server":  # the URL names the shard
            body = {k: v for k, v in body.items() if k not in ("container", "shard")}
        got = extract(url, body, headers)
        assert got.status == 422, (what, got.status, got.body[:300])
        answer = json.loads(got.body)
        assert answer["code"] == "invalid_request", (what, answer)
        assert cause in answer["detail"], (what, answer["detail"])
    # The same process still serves every architecture.
    for arch, case in CASES.items():
        body = _body(arch_env, arch, case.split)
        if via != "server":
            body = {k: v for k, v in body.items() if k not in ("container", "shard")}
        got = extract(url, body, headers)
        assert got.status == 200, (arch, got.body[:300])
        assert got.end is not None and got.end.samples == 10
        assert got.features().shape == _feature_shape(case, 10)


def test_an_upload_of_an_unknown_architecture_is_refused_before_any_byte(
    arch_env: ArchEnv,
) -> None:
    conn = arch_env.stack.connection()
    try:
        with pytest.raises(hapi_models.UnknownModelError, match="did you mean 'tinycnn'"):
            upload_model(conn, "tinycn", container=MODELS)
        names = [o["name"] for o in conn.get_container(MODELS)[1]]
    finally:
        conn.close()
    assert not any(name.startswith("tinycn.") for name in names)
