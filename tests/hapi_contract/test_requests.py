"""Request schemas: good input is accepted, each bad field is refused with a useful message."""

from __future__ import annotations

import copy
import json
import re
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from hapi_contract import (
    API_PREFIX,
    CONTAINER_NAME_PATTERN,
    CONTENT_TYPE_FRAMES,
    DEFAULT_COMPRESSION,
    DEFAULT_OUTPUT_DTYPE,
    HEADER_AUTH_TOKEN,
    HEADER_STORAGE_URL,
    OBJECT_NAME_PATTERN,
    Compression,
    ErrorBody,
    ExtractRequest,
    FinetuneRequest,
    ModelInfo,
    OutputDtype,
    ProfileConversionError,
    ProfileSpec,
    TransformSpec,
    output_bytes,
    profile_to_spec,
)

SHA = "ab" * 32
TRANSFORM = {
    "resize": 256,
    "crop": 224,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
}
PROFILE = {
    "input_shape": [3, 224, 224],
    "output_bytes_per_sample": [400, 300, 40],
    "activation_bytes_per_sample": [800, 600, 80],
    "weight_bytes": 1000,
}
MODEL = {
    "arch": "alexnet",
    "num_classes": 10,
    "weights": {"container": "models", "object": "alexnet/v1.safetensors", "sha256": SHA},
}
EXTRACT = {
    "container": "fashion",
    "shard": "train/shard-00000.tar",
    "model": MODEL,
    "split_index": 2,
    "transform": TRANSFORM,
    "b_max": 200,
    "profile": PROFILE,
    "output_dtype": "float16",
    "compression": "none",
    "request_id": "run-1:shard-0",
}
FINETUNE = {
    "container": "fashion",
    "shards": ["train/shard-00000.tar", "train/shard-00001.tar"],
    "eval_shards": ["test/shard-00000.tar"],
    "model": MODEL,
    "freeze_index": 5,
    "transform": TRANSFORM,
    "batch_size": 128,
    "epochs": 2,
    "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4},
    "seed": 42,
    "b_max": 100,
}


DELETE = object()  # marks a field to remove in _with


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with ``path`` (dotted) set to ``value`` (or removed if DELETE)."""
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


def _errors(model: type[BaseModel], data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return str(info.value)


def test_constants() -> None:
    assert API_PREFIX == "/v1"
    assert CONTENT_TYPE_FRAMES == "application/x-hapi-frames"
    assert HEADER_AUTH_TOKEN == "X-Auth-Token"
    assert HEADER_STORAGE_URL == "X-Storage-Url"


def test_extract_request_accepts_good_input_and_round_trips_json() -> None:
    req = ExtractRequest.model_validate(EXTRACT)
    # Not the defaults (bfloat16, zstd): what the request names is what it gets.
    assert req.output_dtype is OutputDtype.FLOAT16
    assert req.compression is Compression.NONE
    assert req.transform.mean == (0.485, 0.456, 0.406)
    assert req.model.weights is not None and req.model.weights.sha256 == SHA
    assert req.profile is not None and req.profile.num_layers == 3
    again = ExtractRequest.model_validate_json(req.model_dump_json())
    assert again == req
    # What FastAPI does: json.loads, then validate the Python objects.
    assert ExtractRequest.model_validate(json.loads(req.model_dump_json())) == req


def test_extract_request_defaults() -> None:
    data = {
        k: v
        for k, v in EXTRACT.items()
        if k not in {"profile", "output_dtype", "compression", "request_id"}
    }
    data["model"] = {"arch": "resnet18", "num_classes": 1000}
    req = ExtractRequest.model_validate(data)
    assert req.output_dtype is DEFAULT_OUTPUT_DTYPE
    assert req.compression is DEFAULT_COMPRESSION
    assert req.profile is None and req.request_id is None and req.model.weights is None
    assert TransformSpec.model_validate(TRANSFORM).grayscale_to_rgb is True


def test_models_are_frozen() -> None:
    req = ExtractRequest.model_validate(EXTRACT)
    with pytest.raises(ValidationError, match="frozen"):
        req.split_index = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("surprise", 1, "Extra inputs are not permitted"),
        ("container", "", "at least 1 character"),
        ("container", "a/b", "must not contain '/'"),
        ("container", "x" * 257, "at most 256 characters"),
        ("container", "é" * 129, "258 UTF-8 bytes"),
        ("container", 5, "valid string"),
        ("shard", "/abs/path", "must not start with '/'"),
        ("shard", "x" * 1025, "at most 1024 characters"),
        ("shard", "é" * 513, "1026 UTF-8 bytes, the limit is 1024"),
        ("shard", "bad\nname", "control characters"),
        ("shard", DELETE, "Field required"),
        ("model.arch", "AlexNet", "should match pattern"),
        ("model.arch", "alex-net", "should match pattern"),
        ("model.num_classes", 0, "greater than or equal to 1"),
        ("model.num_classes", 100_001, "less than or equal to 100000"),
        ("model.num_classes", "10", "valid integer"),
        ("model.num_classes", True, "valid integer"),
        ("model.weights.sha256", "AB" * 32, "should match pattern"),
        ("model.weights.sha256", "ab" * 31, "should match pattern"),
        ("model.weights.object", "", "at least 1 character"),
        ("model.weights.container", "m/n", "must not contain '/'"),
        ("split_index", -1, "greater than or equal to 0"),
        ("split_index", 2.5, "valid integer"),
        ("split_index", 2.0, None),  # allowed: JSON Schema's integer 2.0 is the number 2
        ("split_index", "2", "valid integer"),
        ("split_index", 4, "split_index (4) exceeds the number of profiled layers (3)"),
        ("b_max", 0, "greater than or equal to 1"),
        ("b_max", 100_001, "less than or equal to 100000"),
        ("transform.resize", 7, "greater than or equal to 8"),
        ("transform.crop", 1025, "less than or equal to 1024"),
        ("transform.crop", 255, None),  # allowed: crop < resize
        ("transform.resize", 200, "crop (224) must not exceed resize (200)"),
        ("transform.mean", [0.5, 0.5], "mean.2\n  Field required"),
        ("transform.mean", [0.5, 0.5, float("nan")], "finite"),
        ("transform.std", [0.2, 0.0, 0.2], "greater than 0"),
        ("transform.std", [0.2, -1.0, 0.2], "greater than 0"),
        ("transform.std", [0.2, float("inf"), 0.2], "finite"),
        ("transform.grayscale_to_rgb", "yes", "valid boolean"),
        ("profile.input_shape", [3, 224], "input_shape.2\n  Field required"),
        ("profile.input_shape", [0, 224, 224], "greater than or equal to 1"),
        ("profile.output_bytes_per_sample", [400, -1, 40], "greater than or equal to 0"),
        ("profile.output_bytes_per_sample", [], "at least 1 item"),
        ("profile.activation_bytes_per_sample", [1, 2], "has 3 layers but"),
        ("profile.weight_bytes", -5, "greater than or equal to 0"),
        ("output_dtype", "float64", "'float32', 'float16' or 'bfloat16'"),
        ("compression", "gzip", "'none' or 'zstd'"),
        ("request_id", "has space", "should match pattern"),
        ("request_id", "x" * 129, "should match pattern"),
        ("etag", "0" * 32, None),
        ("etag", "A" * 32, "should match pattern"),
        ("etag", '"' + "0" * 32 + '"', "should match pattern"),
    ],
)
def test_extract_request_rejects_bad_field(path: str, value: Any, message: str | None) -> None:
    data = _with(EXTRACT, path, value)
    if message is None:
        ExtractRequest.model_validate(data)
        return
    text = _errors(ExtractRequest, data)
    assert message in text
    # The error names the field (its location) so the caller knows what to fix.
    field = path.split(".")[-1]
    assert field in text or path.split(".")[0] in text


def test_finetune_request_accepts_good_input() -> None:
    req = FinetuneRequest.model_validate(FINETUNE)
    assert req.optimizer.name == "sgd" and req.optimizer.momentum == 0.9
    assert FinetuneRequest.model_validate_json(req.model_dump_json()) == req
    minimal = {k: v for k, v in FINETUNE.items() if k not in {"eval_shards", "seed"}}
    assert FinetuneRequest.model_validate(minimal).eval_shards == []
    pins = {"test/shard-00000.tar": "0" * 32}  # eval shards are pinned by the same map
    assert FinetuneRequest.model_validate({**FINETUNE, "etags": pins}).etags == pins


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("shards", [], "at least 1 item"),
        ("shards", ["a"] * 2, "shards lists the same shard more than once"),
        ("shards", ["ok", "/bad"], "must not start with '/'"),
        ("eval_shards", ["x", "x"], "eval_shards lists the same shard more than once"),
        ("epochs", 0, "greater than or equal to 1"),
        ("epochs", 1001, "less than or equal to 1000"),
        ("batch_size", 0, "greater than or equal to 1"),
        ("freeze_index", -1, "greater than or equal to 0"),
        ("seed", -1, "greater than or equal to 0"),
        ("optimizer.name", "rmsprop", "'sgd', 'adam' or 'adamw'"),
        ("optimizer.lr", 0.0, "greater than 0"),
        ("optimizer.lr", float("nan"), "finite"),
        ("optimizer.momentum", 1.0, "less than 1"),
        ("optimizer.weight_decay", -0.1, "greater than or equal to 0"),
        ("optimizer.lr", DELETE, "Field required"),
        ("b_max", DELETE, "Field required"),
        ("extra", True, "Extra inputs are not permitted"),
        ("etags", {"train/shard-00000.tar": "xyz"}, "should match pattern"),
        ("etags", {"other.tar": "0" * 32}, "etags names shards the request does not read"),
    ],
)
def test_finetune_request_rejects_bad_field(path: str, value: Any, message: str) -> None:
    assert message in _errors(FinetuneRequest, _with(FINETUNE, path, value))


def test_shard_limit_is_enforced() -> None:
    data = _with(FINETUNE, "shards", [f"s{i}" for i in range(10_001)])
    assert "at most 10000 items" in _errors(FinetuneRequest, data)


def test_error_body_keeps_extra_keys() -> None:
    body = ErrorBody.model_validate({"detail": "queue full", "code": "busy", "retry_after": 3})
    assert body.model_dump() == {"detail": "queue full", "code": "busy", "retry_after": 3}
    assert "Field required" in _errors(ErrorBody, {"detail": "x"})
    assert "at least 1 character" in _errors(ErrorBody, {"detail": "x", "code": ""})


def test_model_info_checks_consistency() -> None:
    good = {
        "name": "alexnet",
        "num_layers": 3,
        "default_freeze_index": 2,
        "layer_names": ["conv1", "conv2", "fc"],
        "transform": TRANSFORM,
    }
    assert ModelInfo.model_validate(good).layer_names[-1] == "fc"
    assert "layer_names has 2 entries, num_layers is 3" in _errors(
        ModelInfo, _with(good, "layer_names", ["a", "b"])
    )
    assert "default_freeze_index (4) exceeds num_layers (3)" in _errors(
        ModelInfo, _with(good, "default_freeze_index", 4)
    )


class _Layer:
    def __init__(self, out: int, act: int) -> None:
        self.output_bytes_per_sample = out
        self.activation_bytes_per_sample = act
        self.output_shape = (out // 4,)


class _Profile:
    def __init__(self, input_shape: tuple[int, ...]) -> None:
        self.layers = [_Layer(400, 800), _Layer(40, 90)]
        self.weight_bytes = 1234
        self.input_shape = input_shape


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 3, 32, 32)])
def test_profile_to_spec(shape: tuple[int, ...]) -> None:
    spec = profile_to_spec(_Profile(shape))
    assert spec == ProfileSpec(
        input_shape=(3, 32, 32),
        output_bytes_per_sample=[400, 40],
        activation_bytes_per_sample=[800, 90],
        weight_bytes=1234,
    )


def test_profile_to_spec_rejects_non_profiles() -> None:
    with pytest.raises(ProfileConversionError, match="is not a model profile"):
        profile_to_spec(object())  # type: ignore[arg-type]
    with pytest.raises(ProfileConversionError, match=r"input_shape must be \(C, H, W\)"):
        profile_to_spec(_Profile((32, 32)))
    bad = _Profile((3, 32, 32))
    bad.weight_bytes = -1
    with pytest.raises(ProfileConversionError, match="weight_bytes"):
        profile_to_spec(bad)


def test_output_bytes_per_split_and_dtype() -> None:
    spec = ProfileSpec.model_validate(PROFILE)
    assert output_bytes(spec, 0, OutputDtype.FLOAT32) == 3 * 224 * 224 * 4
    assert output_bytes(spec, 1, OutputDtype.FLOAT32) == 400
    assert output_bytes(spec, 3, OutputDtype.FLOAT16) == 20
    assert output_bytes(spec, 2, OutputDtype.BFLOAT16) == 150
    with pytest.raises(ValueError, match="outside 0..3"):
        output_bytes(spec, 4, OutputDtype.FLOAT32)


# --- dot segments: the object that is named is the object that is read -------------------------

DOT_NAMES = [".", "..", "./a.tar", "../a.tar", "a/../b", "a/./b", "a/.", "a/..", "a//./b"]


@pytest.mark.parametrize("name", DOT_NAMES)
@pytest.mark.parametrize("path", ["shard", "model.weights.object"])
def test_object_names_with_dot_segments_are_refused(path: str, name: str) -> None:
    text = _errors(ExtractRequest, _with(EXTRACT, path, name))
    assert "must not have a '.' or '..' path segment" in text


@pytest.mark.parametrize("name", [".", ".."])
@pytest.mark.parametrize("path", ["container", "model.weights.container"])
def test_container_names_that_are_dot_segments_are_refused(path: str, name: str) -> None:
    text = _errors(ExtractRequest, _with(EXTRACT, path, name))
    assert "must not have a '.' or '..' path segment" in text


@pytest.mark.parametrize(
    "name", [".hidden", "...", "..a", "a..b", "a/.b/..c/...", "a//b", "a/", "a\\..\\b", "é/ü.tar"]
)
def test_names_with_dots_that_are_not_dot_segments_are_accepted(name: str) -> None:
    assert ExtractRequest.model_validate(_with(EXTRACT, "shard", name)).shard == name
    if "/" not in name:
        assert ExtractRequest.model_validate(_with(EXTRACT, "container", name)).container == name


def test_finetune_refuses_dot_aliases_of_a_shard() -> None:
    # 'a.tar' and './a.tar' would be the same object once an HTTP client removed the dot segment.
    text = _errors(FinetuneRequest, _with(FINETUNE, "shards", ["a.tar", "./a.tar"]))
    assert "shards.1" in text and "'.' or '..' path segment" in text


def _remove_dot_segments(path: str) -> str:
    """RFC 3986, 5.2.4, written out here so the test does not trust the code under test."""
    out: list[str] = []
    for seg in path.split("/"):
        if seg == "..":
            if len(out) > 1:
                out.pop()
        elif seg != ".":
            out.append(seg)
    if path.split("/")[-1] in {".", ".."}:
        out.append("")
    return "/".join(out)


@settings(max_examples=400, deadline=None, database=None)
@given(st.text(alphabet=st.sampled_from(["a", "é", ".", "/", "\\", "%", " "]), max_size=12))
def test_an_accepted_object_name_reaches_swift_unchanged(name: str) -> None:
    """Accepted iff a non-empty name without a leading '/' has no dot segment; and every
    accepted name leaves an HTTP client's URL path as written (what Swift then reads)."""
    data = _with(EXTRACT, "shard", name)
    segments = name.split("/")
    expected = bool(name) and not name.startswith("/") and not ({".", ".."} & set(segments))
    try:
        ExtractRequest.model_validate(data)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted == expected, name
    if accepted:
        path = "/v1/AUTH_t/c/" + quote(name, safe="/")
        assert _remove_dot_segments(path) == path
        assert httpx.URL("http://swift" + path).raw_path.decode() == path


def test_name_rules_are_in_the_json_schema() -> None:
    """The schema states the rules pydantic enforces, so a schema-valid name is never refused."""
    props = ExtractRequest.model_json_schema()["properties"]
    assert props["container"]["pattern"] == CONTAINER_NAME_PATTERN
    assert props["container"]["minLength"] == 1 and props["container"]["maxLength"] == 256
    assert props["shard"]["pattern"] == OBJECT_NAME_PATTERN
    assert props["shard"]["minLength"] == 1 and props["shard"]["maxLength"] == 1024
    ft = FinetuneRequest.model_json_schema()["properties"]
    assert ft["shards"]["uniqueItems"] is True and ft["eval_shards"]["uniqueItems"] is True
    assert ft["shards"]["items"]["pattern"] == OBJECT_NAME_PATTERN
    # The pattern, read as ECMA/Python regex, agrees with the validator on the tricky cases.
    for name in [*DOT_NAMES, "/a", "a\nb"]:
        assert re.fullmatch(OBJECT_NAME_PATTERN, name) is None, name
    for name in [".hidden", "...", "a//b", "a/"]:
        assert re.fullmatch(OBJECT_NAME_PATTERN, name), name


def _keys(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keys(v)}
    return set()


@pytest.mark.parametrize("model", [ExtractRequest, FinetuneRequest, ModelInfo])
def test_json_schema_uses_only_json_schema_constraints(model: type[BaseModel]) -> None:
    """Bounds are ``minimum``/``maximum`` (what schema tools read), not pydantic's ``ge``/``le``
    leaking through when a validator wraps the constraints."""
    keys = _keys(model.model_json_schema())
    assert not keys & {"ge", "le", "gt", "lt", "allow_inf_nan"}, keys
    assert {"minimum", "maximum"} <= keys


def test_integral_floats_are_integers_but_strings_and_bools_are_not() -> None:
    req = FinetuneRequest.model_validate(_with(FINETUNE, "epochs", 3.0))
    assert req.epochs == 3 and type(req.epochs) is int
    for bad in (3.5, "3", True):
        assert "valid integer" in _errors(FinetuneRequest, _with(FINETUNE, "epochs", bad))
