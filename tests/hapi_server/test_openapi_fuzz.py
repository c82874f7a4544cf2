"""Schema-driven fuzzing: the real server, over HTTP, against its own ``/openapi.json``.

Schemathesis generates requests from the document (valid ones and, in negative mode, invalid
ones) and checks every answer: never a 5xx, and status, content type and body all as
documented; and the document says what the server refuses: a valid request is accepted (no 413
or 422: the architectures are an enum, and the body limit is the document's
``x-max-body-bytes``, over which a 413 is expected instead), an invalid one refused. Valid
requests carry the session's real Swift credentials so that they get past authentication into
the Swift reads; invalid ones keep what was generated, headers included. Valid bodies are made
to keep the cross-field rules that the request models' descriptions name (JSON Schema cannot
state them), see ``_keep_cross_field_rules``.
"""

from __future__ import annotations

import json
import os
from typing import cast

import hapi_models
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import BaseSchema, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from hapi_contract import ErrorBody
from hapi_server import ServerSettings

from .conftest import DATA, MODELS, Dataset, ServerProcess

pytestmark = [pytest.mark.swift, pytest.mark.slow]

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# The default keeps the module under a minute on a 2-core machine, inside `make test`'s 20 minutes;
# the campaign that found nothing more at 150 cases per operation and mode (0 server errors, 0
# conformance failures) is opt-in: HAPI_FUZZ_EXAMPLES=150 (docs/architecture.md, Development).
MAX_EXAMPLES = int(os.environ.get("HAPI_FUZZ_EXAMPLES", "25"))
POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
# The schema says what is refused: valid data is accepted, invalid data refused.
DATA_CHECKS = {POSITIVE: positive_data_acceptance, NEGATIVE: negative_data_rejection}
# The smallest crop every architecture runs on (alexnet's pooling needs 63): a smaller one is the
# documented 422 "a crop too small for the architecture".
MIN_CROP = 64
# Architectures that need more (torchvision's weights metadata, ``min_size``): InceptionV3's
# last stages leave a 2x2 map at 64 px where a 3x3 kernel runs (the server's 422 said so when a
# valid case drew it).
MIN_CROPS = {"inception_v3": 75}
# The architectures that run on their own crop alone: a ViT's position embedding fixes its input
# size, and MaxViT's 7x7 windows need every stage's feature map divisible by 7 (224, 448, ...).
# Every other listed architecture runs on any crop from its minimum up (checked over 64, 97 and 575).
FIXED_INPUT = ("vit_", "maxvit_")
# Fewer classes than would make any architecture's weights pass HAPI_MAX_WEIGHTS_BYTES (VGG19
# does near 97,000): over that, the documented 413 for weights bytes, checked before any read.
MAX_CLASSES = 50_000
# Every operation of the document, each with the modes it is fuzzed in; a test below fails if
# the document gains an operation that is not listed here, so no route escapes the fuzzing.
OPERATIONS = [
    ("POST", "/v1/extract", POSITIVE),
    ("POST", "/v1/extract", NEGATIVE),
    ("POST", "/v1/timings", POSITIVE),
    ("POST", "/v1/timings", NEGATIVE),
    ("POST", "/v1/finetune", POSITIVE),
    ("POST", "/v1/finetune", NEGATIVE),
    ("GET", "/v1/models", POSITIVE),
    ("GET", "/healthz", POSITIVE),
    ("GET", "/metrics", POSITIVE),
]


@pytest.fixture(scope="module")
def api_schema(hapi_server: ServerProcess) -> BaseSchema:
    return schemathesis.openapi.from_url(f"{hapi_server.url}/openapi.json")


@pytest.fixture(scope="module")
def body_limit(api_schema: BaseSchema) -> int:
    limit = api_schema.raw_schema["info"]["x-max-body-bytes"]
    assert limit == ServerSettings().max_request_body_bytes
    return int(limit)


def test_every_operation_is_fuzzed(api_schema: BaseSchema) -> None:
    documented = {
        (op.method.upper(), op.path) for op in (r.ok() for r in api_schema.get_all_operations())
    }
    assert documented == {(method, path) for method, path, _ in OPERATIONS}


@pytest.fixture(scope="module")
def num_layers(hapi_server: ServerProcess) -> dict[str, int]:
    models = httpx.get(f"{hapi_server.url}/v1/models", timeout=600).json()
    return {m["name"]: m["num_layers"] for m in models}


@pytest.fixture(scope="module")
def over_the_weights_limit(num_layers: dict[str, int]) -> set[str]:
    """Architectures whose weights alone exceed the server's limit (ViT-H/14, RegNetY-128GF):
    the document lists them, and the server refuses them with its documented 413 whatever the
    class count. torchvision's weights metadata counts their parameters without building them."""
    from torchvision.models import get_model_weights

    limit = ServerSettings().max_weights_bytes
    over = set()
    for arch in num_layers:
        try:
            params = get_model_weights(arch).DEFAULT.meta["num_params"]  # type: ignore[attr-defined]
        except ValueError:  # not a torchvision network: the thesis' zoo, all far below
            continue
        if params * 4 > limit:
            over.add(arch)
    return over


def _keep_cross_field_rules(
    body: dict[str, object], num_layers: dict[str, int], too_large: set[str]
) -> None:
    """Make a schema-valid body keep the rules the request models' descriptions name.

    Those JSON Schema cannot state: a split or freeze index within the architecture's layers
    (and the profile's, whose two lists are equally long), ``crop`` not over ``resize``, a crop
    the architecture can run on, weights within the weights size limit, a layout's own
    fields (``data_container``, ``label_field``) only with that layout, and pins (``etags``)
    only for shards the body names.
    """
    layout = body.get("layout", "shards")
    if layout != "folder":
        body.pop("data_container", None)
    if layout != "webdataset":
        body.pop("label_field", None)
    etags = body.get("etags")
    if isinstance(etags, dict):
        named = {
            name
            for field in ("shards", "eval_shards")
            for name in cast(list[str], body.get(field, []))
        }
        body["etags"] = {name: etag for name, etag in etags.items() if name in named}
    model = body["model"]
    assert isinstance(model, dict)
    arch = model["arch"]
    assert arch in num_layers, arch  # the document's enum
    if arch in too_large:
        arch = model["arch"] = "alexnet"
    model["num_classes"] = min(model["num_classes"], MAX_CLASSES)
    if body.get("target_classes") is not None:
        body["target_classes"] = min(body["target_classes"], MAX_CLASSES)  # type: ignore[call-overload]
    layers = num_layers[arch]
    profile = body.get("profile")
    if isinstance(profile, dict):
        out, act = profile["output_bytes_per_sample"], profile["activation_bytes_per_sample"]
        n = min(len(out), len(act))
        profile["output_bytes_per_sample"], profile["activation_bytes_per_sample"] = (
            out[:n],
            act[:n],
        )
        layers = min(layers, n)
    # Numbers may come as 3.0: JSON Schema's integers include them, and so does the server.
    for index in ("split_index", "freeze_index"):
        if index in body:
            body[index] = min(body[index], layers)  # type: ignore[call-overload]
    transform = body["transform"]
    assert isinstance(transform, dict)
    transform["crop"] = max(transform["crop"], MIN_CROPS.get(arch, MIN_CROP))
    if arch.startswith(FIXED_INPUT):
        transform["crop"] = hapi_models.get_spec(arch).transform.crop
    transform["resize"] = max(transform["resize"], transform["crop"])


def _aim_at_real_objects(
    case: Case,
    data: st.DataObject,
    dataset: Dataset,
    num_layers: dict[str, int],
    too_large: set[str],
) -> None:
    """Keep the cross-field rules, and point a share of the valid bodies at real objects.

    This takes a share of them further, into the weights check and the Swift reads, and keeps
    them schema-valid. Shards stay generated names (a 404), so no fuzzed transform or batch size
    starts real work whose memory and time the test cannot bound.
    """
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("model"), dict):
        return
    arch = data.draw(st.sampled_from([None, *sorted(dataset.weights)]), label="arch")
    if arch is not None:
        obj, sha = dataset.weights[arch]
        body["model"]["arch"] = arch
        body["model"]["weights"] = {"container": MODELS, "object": obj, "sha256": sha}
        body["model"]["num_classes"] = 3  # what the stored weights were saved with
        body.pop("profile", None)
        if data.draw(st.booleans(), label="real container"):
            body["container"] = DATA
    _keep_cross_field_rules(body, num_layers, too_large)


# Not schemathesis's own pytest integration (``schemathesis.pytest.from_fixture``): it sets a
# private pytest attribute that pytest 9.2 no longer has. Its case strategies with Hypothesis's
# ``@given`` do the same generation and the same checks.
@pytest.mark.parametrize(
    ("method", "path", "mode"), OPERATIONS, ids=[f"{m} {p} {g.value}" for m, p, g in OPERATIONS]
)
def test_server_conforms_to_its_openapi_document(
    api_schema: BaseSchema,
    dataset: Dataset,
    num_layers: dict[str, int],
    over_the_weights_limit: set[str],
    body_limit: int,
    method: str,
    path: str,
    mode: GenerationMode,
) -> None:
    operation = api_schema[path][method]
    # Valid requests carry real credentials, so they get past authentication into the Swift
    # reads; invalid ones keep the generated headers, so header parsing is fuzzed too.
    headers = dataset.headers() if mode is POSITIVE and operation.headers else None
    strategy = operation.as_strategy(generation_mode=mode, headers=headers)
    seen: set[int] = set()
    oversized: list[int] = []

    @given(case=strategy, data=st.data())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,  # no example database written into the checkout
        derandomize=True,  # the same cases every run: a failure here reproduces
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Case, data: st.DataObject) -> None:
        if mode is POSITIVE:
            _aim_at_real_objects(case, data, dataset, num_layers, over_the_weights_limit)
        response = case.call(timeout=120)
        sent = response.request.body or b""
        if len(sent) > body_limit:  # the document's x-max-body-bytes: a 413, valid or not
            assert response.status_code == 413, (len(sent), response.status_code)
            case.validate_response(response, checks=CHECKS)
            oversized.append(len(sent))
        else:
            case.validate_response(response, checks=[*CHECKS, DATA_CHECKS[mode]])
        seen.add(response.status_code)

    fuzz()
    print(
        f"{method} {path} {mode.value}: statuses {sorted(seen)}, "
        f"{len(oversized)} bodies over the {body_limit}-byte limit (413)"
    )
    if mode is NEGATIVE:  # an invalid request is refused, whatever else happens
        assert seen and all(400 <= status < 500 for status in seen), seen
    elif operation.body:  # valid requests got past validation into Swift reads
        assert 404 in seen, seen
    else:
        assert seen == {200}, seen


def test_openapi_documents_error_bodies_and_media_types(hapi_server: ServerProcess) -> None:
    """The document states what the fuzzing relies on, independently of schemathesis."""
    doc = httpx.get(f"{hapi_server.url}/openapi.json", timeout=30).json()
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert set(doc["components"]["schemas"]["ErrorBody"]["required"]) == {"detail", "code"}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if status[0] in "45" and (path, status) != ("/healthz", "503"):
                    assert response["content"] == {"application/json": {"schema": error_ref}}, (
                        method,
                        path,
                        status,
                    )
    assert set(doc["paths"]["/v1/extract"]["post"]["responses"]["200"]["content"]) == {
        "application/x-hapi-frames"
    }
    assert set(doc["paths"]["/v1/finetune"]["post"]["responses"]["200"]["content"]) == {
        "application/octet-stream"
    }
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    shard = doc["components"]["schemas"]["ExtractRequest"]["properties"]["shard"]
    assert shard["minLength"] == 1 and "pattern" in shard
    # What the server refuses beyond the contract: the architectures, required weights, the
    # epochs and body limits.
    model_ref = doc["components"]["schemas"]["ModelRef"]
    assert model_ref["properties"]["arch"]["enum"] == hapi_models.list_models()
    assert "weights" in model_ref["required"]
    settings = ServerSettings()
    epochs = doc["components"]["schemas"]["FinetuneRequest"]["properties"]["epochs"]
    assert epochs["maximum"] == settings.max_finetune_epochs
    limit = settings.max_request_body_bytes
    assert doc["info"]["x-max-body-bytes"] == limit
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert f"{limit} bytes" in op["responses"]["413"]["description"], path
            if "requestBody" in op:
                assert op["requestBody"]["x-max-body-bytes"] == limit, path


def test_validation_errors_are_error_bodies(hapi_server: ServerProcess, dataset: Dataset) -> None:
    """The 422 the document promises is the body the server sends (not FastAPI's list)."""
    resp = httpx.post(
        f"{hapi_server.url}/v1/extract", json={"container": ""}, headers=dataset.headers()
    )
    assert resp.status_code == 422
    body = ErrorBody.model_validate(resp.json())
    assert body.code == "invalid_request" and "container" in body.detail
    metrics = httpx.get(f"{hapi_server.url}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")


def test_a_valid_body_over_the_documented_limit_is_a_413(
    hapi_server: ServerProcess, dataset: Dataset
) -> None:
    """The 1.77 MB finetune body of a longer campaign: schema-valid, and over x-max-body-bytes."""
    from hapi_contract import FinetuneRequest

    limit = ServerSettings().max_request_body_bytes
    body = {
        "container": DATA,
        "shards": [f"{i:04d}-" + "s" * 1000 for i in range(1800)],
        "model": {
            "arch": "alexnet",
            "num_classes": 3,
            "weights": {"container": MODELS, "object": "w", "sha256": "0" * 64},
        },
        "freeze_index": 1,
        "transform": {"resize": 64, "crop": 64, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]},
        "batch_size": 4,
        "epochs": 1,
        "optimizer": {"lr": 0.1},
        "b_max": 4,
    }
    FinetuneRequest.model_validate(body)  # valid by the contract
    data = json.dumps(body).encode()
    assert len(data) > limit
    resp = httpx.post(
        f"{hapi_server.url}/v1/finetune",
        content=data,
        headers={**dataset.headers(), "Content-Type": "application/json"},
        timeout=60,
    )
    assert resp.status_code == 413 and resp.json()["code"] == "too_large"
