"""Schema-driven fuzzing: the real server, over HTTP, against its own ``/openapi.json``.

Schemathesis generates requests from the document (valid ones and, in negative mode, invalid
ones) and checks every answer: never a 5xx, and status, content type and body all as
documented. Valid requests carry the session's real Swift credentials so that they get past
authentication into the Swift reads; invalid ones keep what was generated, headers included.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import BaseSchema, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
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
# Bounded so the module stays within a few minutes on a 2-core machine.
MAX_EXAMPLES = 150
POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
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


def test_every_operation_is_fuzzed(api_schema: BaseSchema) -> None:
    documented = {
        (op.method.upper(), op.path) for op in (r.ok() for r in api_schema.get_all_operations())
    }
    assert documented == {(method, path) for method, path, _ in OPERATIONS}


@pytest.fixture(scope="module")
def num_layers(hapi_server: ServerProcess) -> dict[str, int]:
    models = httpx.get(f"{hapi_server.url}/v1/models", timeout=60).json()
    return {m["name"]: m["num_layers"] for m in models}


def _aim_at_real_objects(
    case: Case, data: st.DataObject, dataset: Dataset, num_layers: dict[str, int]
) -> None:
    """Point a share of the generated valid bodies at real architectures and objects.

    Random bodies mostly stop at a documented refusal that the schema cannot state (an unknown
    architecture, a split index past its layers, ``crop`` over ``resize``); this takes a share
    of them further, into the weights check and the Swift reads, and keeps them schema-valid.
    Shards stay generated names (a 404), so no fuzzed transform or batch size starts real work
    whose memory and time the test cannot bound.
    """
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("model"), dict):
        return
    arch = data.draw(st.sampled_from([None, *sorted(dataset.weights)]), label="arch")
    if arch is None:
        return
    obj, sha = dataset.weights[arch]
    body["model"]["arch"] = arch
    body["model"]["weights"] = {"container": MODELS, "object": obj, "sha256": sha}
    if data.draw(st.booleans(), label="matching num_classes"):
        body["model"]["num_classes"] = 3  # what the stored weights were saved with
    body.pop("profile", None)
    # Numbers may come as 3.0: JSON Schema's integers include them, and so does the server.
    for index in ("split_index", "freeze_index"):
        if index in body:
            body[index] = min(body[index], num_layers[arch])
    if "epochs" in body:
        body["epochs"] = min(body["epochs"], ServerSettings().max_finetune_epochs)
    transform = body["transform"]
    transform["crop"] = min(transform["crop"], transform["resize"])
    if data.draw(st.booleans(), label="real container"):
        body["container"] = DATA


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
            _aim_at_real_objects(case, data, dataset, num_layers)
        response = case.call_and_validate(checks=CHECKS, timeout=120)
        seen.add(response.status_code)

    fuzz()
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
