"""Request and response schemas shared by the HAPI server and client.

Every model forbids unknown fields and refuses silent coercions (``"5"`` is not an int, ``True``
is not a count; ``5.0`` is, as in JSON Schema), so a typo in a client surfaces as a 422 naming
the field instead of a default quietly taking its place. Models are frozen value objects; build a changed copy with
``model_copy(update=...)``.

Every rule that JSON Schema can state is a schema constraint (lengths, bounds, patterns, unique
items), so ``/openapi.json`` documents what is refused; the few cross-field rules are named in
the models' descriptions. What only a server knows, its OpenAPI document adds (see
``hapi_server.route_docs.install_openapi``): the architectures as an enum (the contract imports
no model registry), that ``model.weights`` is required, its epochs limit, and its request body
limit in bytes (the ``x-max-body-bytes`` extension, 413 over; 1 MiB by default).

Swift names follow Swift's own limits (``swift/common/constraints.py``): a container name is at
most 256 UTF-8 bytes and has no ``/``; an object name is at most 1024 UTF-8 bytes. Control
characters are refused in both because names travel in URLs, headers and logs, and so are ``.``
and ``..`` path segments, which HTTP clients remove from a URL before sending it.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hapi_contract.dataset import DatasetLayout

__all__ = [
    "CONTAINER_NAME_PATTERN",
    "DEFAULT_COMPRESSION",
    "DEFAULT_OUTPUT_DTYPE",
    "MAX_CONTAINER_NAME_BYTES",
    "MAX_OBJECT_NAME_BYTES",
    "OBJECT_NAME_PATTERN",
    "Compression",
    "ContainerName",
    "DatasetSource",
    "Etag",
    "ExtractRequest",
    "FinetuneRequest",
    "ModelRef",
    "ObjectName",
    "OptimizerSpec",
    "OutputDtype",
    "ProfileSpec",
    "TransformSpec",
    "WeightsRef",
    "has_dot_segment",
]

MAX_CONTAINER_NAME_BYTES = 256
MAX_OBJECT_NAME_BYTES = 1024

# The largest sample counts, batch sizes and layer counts a request may name. They bound the
# work one request can ask for; the server applies its own, usually tighter, settings on top.
_MAX_BATCH = 100_000
_MAX_LAYERS = 10_000
#: An architecture's name: a registry name (``vit_b_16``), or a family's ``family/name``
#: (``timm/convnext_atto``, timm's tags included: ``timm/vit_small_patch16_224.augreg_in21k``).
ARCH_PATTERN = r"^[a-z0-9_]+(/[a-z0-9_.]+)?$"
_MAX_SHARDS = 10_000
_MAX_JSON_INT = 2**53 - 1
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# One path segment of a Swift name: no '/', no control characters, and not a dot segment ('.' or
# '..'). HTTP clients remove dot segments from a URL's path (RFC 3986, 5.2.4) before it is sent,
# so a name with one would make the server (and a proxy in front of Swift) read another object
# than the one that was named and authorised. Written without look-arounds: the same pattern is
# enforced by pydantic-core (Rust regex) and published in the JSON schema (ECMA-262).
_SEGMENT_CHAR = r"[^/\x00-\x1f\x7f]"
_SEGMENT_FIRST = r"[^./\x00-\x1f\x7f]"
_SEGMENT = (
    rf"(?:{_SEGMENT_FIRST}{_SEGMENT_CHAR}*"  # starts with anything but a dot
    rf"|\.{_SEGMENT_FIRST}{_SEGMENT_CHAR}*"  # '.x...'
    rf"|\.\.{_SEGMENT_CHAR}+)"  # '..x...', '...'
)
CONTAINER_NAME_PATTERN = rf"^{_SEGMENT}$"
"""A container name: one segment, not '.' or '..', no '/' and no control characters."""

OBJECT_NAME_PATTERN = rf"^{_SEGMENT}(?:/{_SEGMENT}?)*$"
"""An object name: '/'-separated segments, none of them '.' or '..', the first not empty.

Empty segments (``a//b``, ``a/``) are allowed: Swift stores them as written and HTTP clients
send them unchanged.
"""


_DOT_SEGMENTS = frozenset({".", ".."})


def has_dot_segment(name: str, *, segmented: bool = True) -> bool:
    """Whether ``name`` is ``.`` or ``..`` (``segmented``: has such a ``/``-separated segment).

    URL handling (HTTP clients, proxies, RFC 3986) resolves such segments, so a URL holding one
    can reach another object than the one named and authorised: every side refuses them.
    """
    parts = name.split("/") if segmented else [name]
    return any(part in _DOT_SEGMENTS for part in parts)


def _name_problem(value: str, *, what: str) -> tuple[str, str]:
    """Which rule ``value`` breaks, as (error type, words): the pattern itself is opaque."""
    if _CONTROL_CHARS.search(value):
        return "swift_name", f"{what} name must not contain control characters"
    if what == "container" and "/" in value:
        return "swift_name", "container name must not contain '/'"
    if value.startswith("/"):
        return "swift_name", f"{what} name must not start with '/'"
    return "swift_name_dot_segment", (
        f"{what} name must not have a '.' or '..' path segment "
        "(HTTP clients would remove it, and another object would be read)"
    )


def _swift_name_validator(*, what: str, limit: int) -> WrapValidator:
    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> str:
        try:
            name: str = handler(value)
        except ValidationError as exc:
            if isinstance(value, str) and any(
                e["type"] == "string_pattern_mismatch" for e in exc.errors()
            ):
                kind, problem = _name_problem(value, what=what)
                raise PydanticCustomError(kind, "{problem}", {"problem": problem}) from None
            raise
        # The one rule JSON Schema cannot state (it counts characters): Swift's limit is bytes.
        size = len(name.encode("utf-8"))
        if size > limit:
            raise PydanticCustomError(
                "swift_name_too_long",
                "{what} name is {size} UTF-8 bytes, the limit is {limit}",
                {"what": what, "size": size, "limit": limit},
            )
        return name

    return WrapValidator(validate)


ContainerName = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=MAX_CONTAINER_NAME_BYTES,
        pattern=CONTAINER_NAME_PATTERN,
        description=(
            f"A Swift container name: 1..{MAX_CONTAINER_NAME_BYTES} UTF-8 bytes, no '/', no "
            "control characters, not '.' or '..'"
        ),
    ),
    _swift_name_validator(what="container", limit=MAX_CONTAINER_NAME_BYTES),
]
"""A Swift container name: 1..256 UTF-8 bytes, no '/', no control characters, not '.'/'..'."""

ObjectName = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=MAX_OBJECT_NAME_BYTES,
        pattern=OBJECT_NAME_PATTERN,
        description=(
            f"A Swift object name: 1..{MAX_OBJECT_NAME_BYTES} UTF-8 bytes, no leading '/', no "
            "control characters, no '.' or '..' path segment"
        ),
    ),
    _swift_name_validator(what="object", limit=MAX_OBJECT_NAME_BYTES),
]
"""A Swift object name: 1..1024 UTF-8 bytes, no leading '/', no control characters, and no
'.' or '..' segment between its slashes."""


def _integral_number(value: Any) -> Any:
    # JSON Schema counts 3.0 as an integer (it is the same number as 3), and so do JSON
    # generators; a float with a fraction, a string or a bool is still refused by StrictInt.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_INTEGRAL = BeforeValidator(_integral_number)
"""Makes a StrictInt a JSON integer: ``3`` or ``3.0``, never ``3.5``, ``"3"`` or ``true``. It goes
after the Field constraints, so that they stay ``minimum``/``maximum`` in the JSON schema."""

_Finite = Annotated[StrictFloat, Field(allow_inf_nan=False)]
_PositiveFinite = Annotated[StrictFloat, Field(gt=0, allow_inf_nan=False)]
_NonNegativeFinite = Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)]
_Size = Annotated[StrictInt, Field(ge=1, le=_MAX_BATCH), _INTEGRAL]
_ImageSide = Annotated[StrictInt, Field(ge=8, le=1024), _INTEGRAL]
_Bytes = Annotated[StrictInt, Field(ge=0), _INTEGRAL]
_LayerIndex = Annotated[StrictInt, Field(ge=0, le=_MAX_LAYERS), _INTEGRAL]
Etag = Annotated[
    StrictStr,
    Field(
        pattern=r"^[0-9a-f]{32}$",
        description="an object's etag as its dataset's manifest recorded it: its MD5, 32 "
        "lowercase hex digits, as Swift reports a plain object's",
    ),
]
"""A pinned object's etag: the MD5 Swift reports for a plain object, lowercase hex."""

_PIN = (
    "the server reads the shard only while Swift reports this etag for it, and answers 409 "
    "object_changed naming the object otherwise (overwritten since the manifest was made)"
)


class OutputDtype(StrEnum):
    """Element type of the features on the wire; 16-bit types halve the bytes sent."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


class Compression(StrEnum):
    """Per-frame compression of the features (labels are never compressed)."""

    NONE = "none"
    ZSTD = "zstd"


# The most compact setting whose held-out accuracy stayed within 0.5 points of float32's
# (``python -m hapi_bench.wire_dtypes``: EfficientNet-Lite0 on Fashion-MNIST, all six settings
# 0.876; bfloat16 + zstd sent 39 % of float32's bytes, float16 + zstd 46 %). The tail trains in
# float32 either way (features are widened on arrival); bfloat16 also keeps float32's range, so
# no activation overflows to inf as it can above 65504 in float16. Ask for float32 where
# features must match a local computation to float32 rounding.
DEFAULT_OUTPUT_DTYPE = OutputDtype.BFLOAT16
"""The wire dtype every side uses when none is given (requests, client, CLI, benchmarks)."""

DEFAULT_COMPRESSION = Compression.ZSTD
"""The feature compression every side uses when none is given (zstd level 1, lossless)."""


class WeightsRef(_Model):
    """A safetensors weights object in Swift and the sha256 it must have."""

    container: ContainerName
    object: ObjectName
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="64 lowercase hex digits of the object's SHA-256"
    )


class ModelRef(_Model):
    """Which registry architecture to build, with how many classes and which weights."""

    arch: Annotated[StrictStr, Field(min_length=1, max_length=128, pattern=ARCH_PATTERN)] = Field(
        description="a registry architecture; a server's OpenAPI document lists them as an enum "
        "and `GET /v1/models` describes them (422 for another)"
    )
    num_classes: Annotated[StrictInt, Field(ge=1, le=100_000), _INTEGRAL]
    weights: WeightsRef | None = Field(
        None,
        description="the weights to load; the server's endpoints require them (422 without), so "
        "that the server and the client run the same network",
    )


class TransformSpec(_Model):
    """The input transform: resize the short side, centre-crop, scale to [0, 1], normalise.

    ``crop`` must not exceed ``resize`` (422 otherwise). Validates from the attributes of any
    object (``TransformSpec.model_validate(transform)`` of a ``hapi_models.InputTransform``,
    or that object as a request's ``transform``), so no side maps the fields by hand.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, from_attributes=True)

    resize: _ImageSide
    crop: _ImageSide
    mean: tuple[_Finite, _Finite, _Finite]
    std: tuple[_PositiveFinite, _PositiveFinite, _PositiveFinite]
    grayscale_to_rgb: StrictBool = True

    @model_validator(mode="after")
    def _crop_fits(self) -> TransformSpec:
        if self.crop > self.resize:
            raise ValueError(f"crop ({self.crop}) must not exceed resize ({self.resize})")
        return self


class ProfileSpec(_Model):
    """The client's batch-1 profile of the model, per sample, one entry per layer.

    ``output_bytes_per_sample[i]`` is the float32 size of layer ``i``'s output and
    ``activation_bytes_per_sample[i]`` the memory its forward pass needs, per sample. Both lists
    have one entry per layer, so they must be equally long (422 otherwise).
    """

    input_shape: tuple[
        Annotated[StrictInt, Field(ge=1, le=4096), _INTEGRAL],
        Annotated[StrictInt, Field(ge=1, le=65536), _INTEGRAL],
        Annotated[StrictInt, Field(ge=1, le=65536), _INTEGRAL],
    ]
    output_bytes_per_sample: Annotated[list[_Bytes], Field(min_length=1, max_length=_MAX_LAYERS)]
    activation_bytes_per_sample: Annotated[
        list[_Bytes], Field(min_length=1, max_length=_MAX_LAYERS)
    ]
    weight_bytes: _Bytes

    @model_validator(mode="after")
    def _lengths_match(self) -> ProfileSpec:
        n_out, n_act = len(self.output_bytes_per_sample), len(self.activation_bytes_per_sample)
        if n_out != n_act:
            raise ValueError(
                f"output_bytes_per_sample has {n_out} layers but "
                f"activation_bytes_per_sample has {n_act}; they must be equal"
            )
        return self

    @property
    def num_layers(self) -> int:
        """Number of layers the profile covers."""
        return len(self.output_bytes_per_sample)


def _check_split(split: int, profile: ProfileSpec | None, name: str) -> None:
    if profile is not None and split > profile.num_layers:
        raise ValueError(
            f"{name} ({split}) exceeds the number of profiled layers ({profile.num_layers})"
        )


LabelField = Annotated[
    StrictStr, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")
]


class DatasetSource(_Model):
    """How the shards a request names lie in Swift (a dataset's manifest says it; see
    :mod:`hapi_contract.layouts`). The defaults are an uploaded dataset's, so a request written
    before the in-place layouts existed means what it meant.

    * ``shards``: strict tars written by ``hapi upload dataset`` in ``container``;
    * ``webdataset``: existing WebDataset tars, named as shards in ``container`` (the data
      container), labelled by ``.cls``/``.txt`` or the ``label_field`` of their ``.json``;
    * ``folder``: the shards are part objects in ``container`` (beside the manifest) listing one
      image object per sample, read from ``data_container`` (default: ``container``).
    """

    layout: DatasetLayout = Field(
        DatasetLayout.SHARDS, description="how the named shards lie (the manifest's layout)"
    )
    data_container: ContainerName | None = Field(
        None, description="folder layout: the container of the image objects (default: container)"
    )
    label_field: LabelField | None = Field(
        None, description="webdataset layout: the .json field holding the label (default: .cls)"
    )

    @model_validator(mode="after")
    def _fields_of_the_layout(self) -> DatasetSource:
        if self.data_container is not None and self.layout is not DatasetLayout.FOLDER:
            raise ValueError("data_container is for the folder layout only")
        if self.label_field is not None and self.layout is not DatasetLayout.WEBDATASET:
            raise ValueError("label_field is for the webdataset layout only")
        return self


class ExtractRequest(DatasetSource):
    """``POST /v1/extract``: run the model up to ``split_index`` over one shard, stream features.

    ``split_index`` counts the layers run on the server; 0 sends the transformed input itself.
    It must not exceed the architecture's layer count, nor the profile's when one is sent (422).
    ``etag`` pins the shard object to the one the dataset's manifest recorded (clients send it
    for every shard of a manifest; without it the shard is read as stored).
    """

    container: ContainerName
    shard: ObjectName
    etag: Etag | None = Field(None, description=f"the shard object's recorded etag: {_PIN}")
    model: ModelRef
    split_index: _LayerIndex
    transform: TransformSpec
    b_max: _Size = Field(description="largest COS batch the server may run for this request")
    profile: ProfileSpec | None = None
    output_dtype: OutputDtype = DEFAULT_OUTPUT_DTYPE
    compression: Compression = DEFAULT_COMPRESSION
    request_id: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")] | None = None

    @model_validator(mode="after")
    def _split_within_profile(self) -> ExtractRequest:
        _check_split(self.split_index, self.profile, "split_index")
        return self


class OptimizerSpec(_Model):
    """The optimizer of the ALL_IN_COS fine-tuning run.

    Validates from the attributes of any object, e.g. a ``hapi_models.OptimizerConfig``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, from_attributes=True)

    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: Annotated[StrictFloat, Field(gt=0, le=10, allow_inf_nan=False)]
    momentum: Annotated[StrictFloat, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    weight_decay: _NonNegativeFinite = 0.0


class FinetuneRequest(DatasetSource):
    """``POST /v1/finetune`` (ALL_IN_COS mode): the server trains and returns the weights.

    ``freeze_index`` must not exceed the architecture's layer count, and ``epochs`` the
    server's ``HAPI_MAX_FINETUNE_EPOCHS`` (422 otherwise).
    """

    container: ContainerName
    shards: Annotated[
        list[ObjectName],
        Field(min_length=1, max_length=_MAX_SHARDS, json_schema_extra={"uniqueItems": True}),
    ]
    eval_shards: Annotated[
        list[ObjectName], Field(max_length=_MAX_SHARDS, json_schema_extra={"uniqueItems": True})
    ] = Field(default_factory=list)
    etags: Annotated[dict[ObjectName, Etag], Field(max_length=2 * _MAX_SHARDS)] = Field(
        default_factory=dict,
        description="the recorded etag of each shard of shards and eval_shards, by name (one "
        f"left out is read as stored; a name that is neither: 422): {_PIN}",
    )
    model: ModelRef
    target_classes: Annotated[StrictInt, Field(ge=1, le=100_000), _INTEGRAL] | None = Field(
        None, description="replace the classifier with a new one of this many classes (seeded)"
    )
    freeze_index: _LayerIndex
    transform: TransformSpec
    batch_size: _Size
    epochs: Annotated[StrictInt, Field(ge=1, le=1000), _INTEGRAL]
    optimizer: OptimizerSpec
    # At most 2**53 - 1, the largest integer every JSON parser reads exactly (RFC 7493): above
    # it a number may arrive as a float that rounds past the bound it was generated under.
    seed: Annotated[StrictInt, Field(ge=0, le=_MAX_JSON_INT), _INTEGRAL] = 0
    b_max: _Size
    request_id: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")] | None = None

    @model_validator(mode="after")
    def _no_duplicate_shards(self) -> FinetuneRequest:
        # Comparing the names as strings is comparing the objects Swift reads: Swift matches
        # names byte for byte (no case folding, no Unicode normalisation, 'a//b' is not 'a/b'),
        # the server percent-encodes every name character but '/' (an injective encoding), and
        # the one rewrite an HTTP client makes on the way, dot-segment removal, cannot happen
        # because ObjectName refuses '.' and '..' segments ('a.tar' and './a.tar' never meet here).
        for field in ("shards", "eval_shards"):
            names: list[str] = getattr(self, field)
            if len(set(names)) != len(names):
                raise ValueError(f"{field} lists the same shard more than once")
        unknown = sorted(set(self.etags) - set(self.shards) - set(self.eval_shards))
        if unknown:
            raise ValueError(f"etags names shards the request does not read: {unknown[:3]}")
        return self
