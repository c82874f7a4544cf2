"""Datasets in Swift: the shard tar format and the manifest.

A dataset is one Swift container holding:

* ``shards/shard-000000.tar``, ``shards/shard-000001.tar``, ...: fixed-size shards of ``shard_size``
  samples each (default 1000, as in the thesis; only the last shard may be shorter). A shard is a
  plain (uncompressed) POSIX ustar archive in the WebDataset convention: each sample is two
  consecutive members sharing a *key*, ``<key>.cls`` (the integer class as ASCII decimal, e.g.
  ``b"3"``) and ``<key>.jpg`` or ``<key>.png`` (the encoded image, stored as is). Keys are flat
  (no ``/``), contain no ``.``, and are unique within a shard; the uploader uses the global sample
  index, zero-padded to 9 digits. Members are written in sample order, ``.cls`` before the image
  (sorted extensions, as WebDataset's ``TarWriter`` does), with mtime 0, uid/gid 0, empty
  user/group names and mode 0644, so the same samples always give the same bytes (and the same
  MD5, which is what Swift reports as the etag).
* ``manifest.json``: a :class:`DatasetManifest` (UTF-8 JSON), written after every shard it lists
  exists, so a reader that sees a manifest can read every shard in it.

That is the ``shards`` :class:`DatasetLayout`, the one ``hapi upload dataset`` writes. A manifest
may instead index data already in Swift, in place (``hapi dataset index``): its ``layout`` is then
``webdataset`` (existing tar shards of any size, read by a tolerant reader) or ``folder`` (one
object per image, listed in *part* objects), and ``data_container`` names where the data objects
lie when that is not the manifest's own container. Those formats are specified in
:mod:`hapi_contract.layouts`. A manifest of the ``shards`` layout serialises exactly as before
the in-place layouts existed (the new fields are left out at their defaults), so its bytes and
etag do not change.

Reading a shard never touches the disk: :func:`read_shard` walks the archive in memory and
rejects anything that is not exactly this format (see :class:`ShardFormatError`).
"""

from __future__ import annotations

import bisect
import hashlib
import io
import re
import tarfile
import unicodedata
from collections.abc import Iterable
from enum import StrEnum
from typing import Final, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hapi_contract._tar_buffer import ImageData, member_bytes, open_tar
from hapi_contract.errors import ContractError

__all__ = [
    "DEFAULT_MAX_IMAGE_BYTES",
    "DEFAULT_MAX_SHARD_SAMPLES",
    "DEFAULT_SHARD_SIZE",
    "IMAGE_EXTENSIONS",
    "ImageData",
    "MANIFEST_CONTENT_TYPE",
    "MANIFEST_FORMAT_VERSION",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "MAX_SKIPPED_EXAMPLES",
    "MAX_OBJECT_NAME_BYTES",
    "SHARD_CONTENT_TYPE",
    "SHARD_PREFIX",
    "DatasetFormatError",
    "DatasetLayout",
    "DatasetManifest",
    "InvalidManifestError",
    "ShardFormatError",
    "ShardInfo",
    "ShardSample",
    "image_extension_of",
    "images_in_prefix",
    "md5_hex",
    "object_name_problem",
    "parse_manifest",
    "read_shard",
    "sample_key",
    "shard_name",
    "write_shard",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_CONTENT_TYPE = "application/json"
MANIFEST_FORMAT_VERSION: Final = 1
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
#: Skipped objects a manifest names (it counts them all).
MAX_SKIPPED_EXAMPLES = 50
SHARD_PREFIX = "shards/"
SHARD_CONTENT_TYPE = "application/x-tar"
DEFAULT_SHARD_SIZE = 1000
# Limits for read_shard: generous for ImageNet-sized data, small enough to bound memory per request.
DEFAULT_MAX_SHARD_SAMPLES = 10_000
DEFAULT_MAX_IMAGE_BYTES = 16 * 1024 * 1024
IMAGE_EXTENSIONS: tuple[str, ...] = ("jpg", "png")

_LABEL_EXTENSION = "cls"
_MAX_LABEL_MEMBER_BYTES = 32
_MAX_LABEL = 10**9 - 1
_END_MARKER_BYTES = 2 * tarfile.BLOCKSIZE
_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_LABEL_RE = re.compile(rb"\s*([0-9]{1,9})\s*")
_ETAG_RE = re.compile(r"[0-9a-f]{32}")
_CONTAINER_RE = re.compile(r"[^/]{1,256}")
# Swift's default max_object_name_length, in UTF-8 bytes.
MAX_OBJECT_NAME_BYTES: Final = 1024
_MAGIC: dict[str, tuple[bytes, ...]] = {
    "jpg": (b"\xff\xd8\xff",),
    "png": (b"\x89PNG\r\n\x1a\n",),
}
# Fixed member metadata: identical samples must give byte-identical shards (same etag in Swift).
_MTIME = 0
_MODE = 0o644


class DatasetLayout(StrEnum):
    """How a dataset's samples lie in Swift (the manifest's ``layout``)."""

    SHARDS = "shards"
    """Shards written by ``hapi upload dataset`` in the strict format of this module."""
    WEBDATASET = "webdataset"
    """Existing WebDataset tar shards (plain or gzip), indexed in place."""
    FOLDER = "folder"
    """One object per image, indexed in place; the manifest's shards are part objects."""


def object_name_problem(name: str) -> str | None:
    """Why ``name`` may not be a dataset object name, or None when it may.

    A name is refused when it is empty or longer than Swift's 1024 UTF-8 bytes, holds a control
    character (it would corrupt logs, listings and error messages), or has a ``.`` or ``..``
    segment (a proxy or a client library may normalise those away and read another object).
    """
    if not name:
        return "empty object name"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_OBJECT_NAME_BYTES:
        return f"object name longer than {MAX_OBJECT_NAME_BYTES} bytes"
    for char in name:
        if unicodedata.category(char) in ("Cc", "Cs"):
            return f"object name holds the control character {char!r}"
    if any(segment in (".", "..") for segment in name.split("/")):
        return "object name has a '.' or '..' path segment"
    return None


class DatasetFormatError(ContractError, ValueError):
    """Base class of the dataset format errors (shards and manifest)."""


class ShardFormatError(DatasetFormatError):
    """A shard is not a well-formed dataset tar: the message says what is wrong and where."""


class InvalidManifestError(DatasetFormatError):
    """A manifest is not valid JSON or does not satisfy the :class:`DatasetManifest` schema."""


class ShardSample(NamedTuple):
    """One sample of a shard: ``key``, encoded ``image_bytes``, ``ext``, ``label``.

    ``ext`` is ``"jpg"`` or ``"png"``; the in-place layouts add ``"webp"`` (a ``.jpeg`` is
    ``"jpg"``).
    """

    key: str
    image_bytes: ImageData
    ext: str
    label: int


def shard_name(index: int) -> str:
    """Object name of shard number ``index``: ``shards/shard-000042.tar``."""
    if index < 0:
        raise ValueError(f"shard index must be >= 0, got {index}")
    return f"{SHARD_PREFIX}shard-{index:06d}.tar"


def sample_key(index: int) -> str:
    """The key the uploader gives to global sample ``index``: 9 zero-padded digits."""
    if index < 0:
        raise ValueError(f"sample index must be >= 0, got {index}")
    return f"{index:09d}"


def md5_hex(data: bytes | bytearray | memoryview) -> str:
    """MD5 of ``data`` as lowercase hex: what Swift reports as the etag of a plain object."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def image_extension_of(data: bytes | bytearray | memoryview) -> str | None:
    """``"jpg"`` or ``"png"`` from the leading magic bytes of ``data``; None if neither."""
    head = bytes(data[:8])
    for ext, magics in _MAGIC.items():
        if head.startswith(magics):
            return ext
    return None


def _check_key(key: str, where: str) -> None:
    if not _KEY_RE.fullmatch(key):
        raise ShardFormatError(
            f"{where}: invalid sample key {key!r}: keys are 1-64 characters of [A-Za-z0-9_-], "
            "starting with a letter or digit"
        )


def _check_image(image: ImageData, ext: str, where: str) -> None:
    if ext not in IMAGE_EXTENSIONS:
        raise ShardFormatError(
            f"{where}: unknown image extension {ext!r} (allowed: {', '.join(IMAGE_EXTENSIONS)})"
        )
    if not bytes(image[:8]).startswith(_MAGIC[ext]):
        found = image_extension_of(image)
        detail = f"looks like {found}" if found else "is neither JPEG nor PNG"
        raise ShardFormatError(f"{where}: image bytes do not match extension {ext!r} ({detail})")


def write_shard(samples: Iterable[tuple[str, bytes, str, int]]) -> bytes:
    """Pack ``(key, image_bytes, ext, label)`` samples into a deterministic shard tar.

    Samples are written in the order given; the same samples always give the same bytes.
    ``ext`` is ``"jpg"`` or ``"png"`` (``"jpeg"`` is accepted and stored as ``"jpg"``) and must
    match the image's magic bytes; ``label`` is a non-negative integer; keys must be unique.

    Raises:
        ShardFormatError: a sample would make an invalid shard (the message names it).
    """
    buffer = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for position, (key, image, ext, label) in enumerate(samples):
            where = f"sample {position} (key {key!r})"
            _check_key(key, where)
            if key in seen:
                raise ShardFormatError(f"{where}: duplicated key")
            seen.add(key)
            ext = "jpg" if ext.lower() == "jpeg" else ext.lower()
            image = bytes(image)
            _check_image(image, ext, where)
            if isinstance(label, bool) or not 0 <= int(label) <= _MAX_LABEL:
                raise ShardFormatError(f"{where}: label must be an integer in 0..{_MAX_LABEL}")
            members = sorted([(_LABEL_EXTENSION, str(int(label)).encode("ascii")), (ext, image)])
            for member_ext, payload in members:
                info = tarfile.TarInfo(f"{key}.{member_ext}")
                info.size = len(payload)
                info.mtime = _MTIME
                info.mode = _MODE
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _split_member_name(name: str) -> tuple[str, str]:
    if "/" in name or "\\" in name or name.startswith(".") or ".." in name:
        raise ShardFormatError(
            f"member {name!r}: path separators and '..' are not allowed in shard member names"
        )
    key, dot, ext = name.partition(".")
    if not dot:
        raise ShardFormatError(f"member {name!r}: no extension")
    return key, ext


def read_shard(
    data: bytes | bytearray | memoryview,
    *,
    max_samples: int = DEFAULT_MAX_SHARD_SAMPLES,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    num_classes: int | None = None,
) -> list[ShardSample]:
    """Parse a shard tar held in memory into its samples, in archive order.

    Nothing is extracted to disk and no member is followed: only regular files named
    ``<key>.cls`` / ``<key>.jpg`` / ``<key>.png`` are accepted, each sample's two members must be
    consecutive, and the limits are checked from the tar headers before any payload is read.
    With ``num_classes`` given, labels must also be below it.

    Raises:
        ShardFormatError: not a tar archive, truncated, a member that is not a regular file, a
            path-like or malformed name, an unknown extension, a missing ``.cls`` or image, a bad
            label, a duplicated key, more than ``max_samples`` samples, a member larger than
            ``max_image_bytes``, image bytes that do not match their extension, or no samples.
    """
    samples: list[ShardSample] = []
    seen: set[str] = set()
    current_key: str | None = None
    parts: dict[str, ImageData] = {}

    def finish() -> None:
        if current_key is None:
            return
        if _LABEL_EXTENSION not in parts:
            raise ShardFormatError(f"sample {current_key!r}: missing .cls member")
        images = [ext for ext in parts if ext != _LABEL_EXTENSION]
        if not images:
            raise ShardFormatError(f"sample {current_key!r}: missing image member (.jpg/.png)")
        match = _LABEL_RE.fullmatch(parts[_LABEL_EXTENSION])
        if match is None:
            raise ShardFormatError(
                f"sample {current_key!r}: bad label {parts[_LABEL_EXTENSION][:16]!r} "
                "(expected a non-negative ASCII integer)"
            )
        label = int(match.group(1))
        if num_classes is not None and label >= num_classes:
            raise ShardFormatError(
                f"sample {current_key!r}: label {label} out of range for {num_classes} classes"
            )
        ext = images[0]
        samples.append(ShardSample(current_key, parts[ext], ext, label))

    try:
        tar, raw = open_tar(data)
    except (tarfile.TarError, EOFError) as exc:
        raise ShardFormatError(f"not a tar archive: {exc}") from exc
    try:
        with tar:
            while True:
                member = tar.next()
                if member is None:
                    break
                name = member.name
                if not member.isreg() or member.issparse():
                    raise ShardFormatError(f"member {name!r}: not a regular file")
                key, ext = _split_member_name(name)
                _check_key(key, f"member {name!r}")
                if ext != _LABEL_EXTENSION and ext not in IMAGE_EXTENSIONS:
                    raise ShardFormatError(
                        f"member {name!r}: unknown extension {ext!r} "
                        f"(allowed: {_LABEL_EXTENSION}, {', '.join(IMAGE_EXTENSIONS)})"
                    )
                if key != current_key:
                    finish()
                    if key in seen:
                        raise ShardFormatError(f"member {name!r}: duplicated key {key!r}")
                    if len(seen) >= max_samples:
                        raise ShardFormatError(
                            f"member {name!r}: shard has more than {max_samples} samples"
                        )
                    seen.add(key)
                    current_key, parts = key, {}
                if ext in parts:
                    raise ShardFormatError(f"member {name!r}: duplicated key {key!r}")
                if ext != _LABEL_EXTENSION and any(e != _LABEL_EXTENSION for e in parts):
                    raise ShardFormatError(f"member {name!r}: sample {key!r} has two images")
                limit = _MAX_LABEL_MEMBER_BYTES if ext == _LABEL_EXTENSION else max_image_bytes
                if member.size > limit:
                    raise ShardFormatError(
                        f"member {name!r}: {member.size} bytes exceeds the limit of {limit} bytes"
                    )
                payload = member_bytes(raw, member)
                if len(payload) != member.size:
                    raise ShardFormatError(f"member {name!r}: truncated archive")
                if ext != _LABEL_EXTENSION:
                    _check_image(payload, ext, f"member {name!r}")
                # A label is a few bytes, parsed at once; an image stays a view of the shard.
                parts[ext] = bytes(payload) if ext == _LABEL_EXTENSION else payload
            # tarfile stops quietly at a truncated or garbled header after the first member, so
            # require the end-of-archive marker (two zero blocks) right after the last member.
            end = tar.offset
            marker = bytes(raw[end : end + _END_MARKER_BYTES])
            if len(marker) < _END_MARKER_BYTES or marker.count(0) != _END_MARKER_BYTES:
                raise ShardFormatError(
                    f"truncated or corrupt archive: no end-of-archive marker at byte {end}"
                )
            finish()
    except (tarfile.TarError, EOFError) as exc:
        raise ShardFormatError(f"corrupt tar archive: {exc}") from exc
    if not samples:
        raise ShardFormatError("shard contains no samples")
    return samples


def images_in_prefix(data: bytes | bytearray | memoryview, limit: int) -> list[bytes]:
    """Up to ``limit`` complete images from the first bytes of a shard (a ranged read of it).

    For measuring how long a dataset's images take to decode without reading whole shards;
    an image cut off by the end of ``data`` is left out, and so is anything that is not one.
    """
    images: list[bytes] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:") as tar:
            while len(images) < limit:
                member = tar.next()
                if member is None:
                    break
                ext = member.name.rpartition(".")[2]
                if not member.isreg() or ext not in IMAGE_EXTENSIONS:
                    continue
                handle = tar.extractfile(member)
                payload = handle.read() if handle is not None else b""
                if len(payload) != member.size:
                    break
                images.append(payload)
    except (tarfile.TarError, EOFError):
        pass  # the cut-off end of the ranged read
    return images


class ShardInfo(BaseModel):
    """One shard as listed in the manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        description="object name: shards/shard-000000.tar for uploaded shards; for the in-place "
        "layouts any object name (a WebDataset tar in the data container, or a part object)"
    )
    samples: int = Field(ge=1, description="number of samples in the shard")
    bytes: int = Field(ge=1, description="size of the shard (or part) object in bytes")
    etag: str = Field(description="MD5 of the object, lowercase hex, as Swift reports it")
    first_index: int = Field(ge=0, description="global index of the shard's first sample")
    image_bytes: int = Field(ge=0, description="sum of the encoded image sizes in the shard")

    @field_validator("name")
    @classmethod
    def _name_pattern(cls, value: str) -> str:
        # The uploaded layout's stricter pattern is checked by the manifest, which knows the layout.
        problem = object_name_problem(value)
        if problem is not None:
            raise ValueError(f"shard name {value!r}: {problem}")
        return value

    @field_validator("etag")
    @classmethod
    def _etag_pattern(cls, value: str) -> str:
        if not _ETAG_RE.fullmatch(value):
            raise ValueError(f"etag {value!r} is not 32 lowercase hex digits")
        return value


class DatasetManifest(BaseModel):
    """The manifest of a dataset container (``manifest.json``).

    Two per-sample sizes are recorded, because they differ a lot for small images:

    * ``mean_image_bytes_per_sample``: the encoded image only (JPEG/PNG bytes), i.e. what the
      dataset takes as stored images;
    * ``mean_shard_bytes_per_sample``: total shard tar bytes / samples, including the tar headers,
      padding and ``.cls`` members: what the raw-streaming baseline really transfers per sample.
      For the ``folder`` layout that is the image objects themselves, so both means are equal
      (the part objects are the index, not data the baseline streams).

    ``shard_size`` is the number of samples of every shard but the last, except for the
    ``webdataset`` layout, whose existing shards hold any number: there it is the largest
    shard's count. Shards are found by ``first_index`` (:meth:`shard_of`) in every layout.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: Literal[1] = MANIFEST_FORMAT_VERSION
    name: str = Field(description="dataset name (the container)")
    num_samples: int = Field(ge=1)
    shard_size: int = Field(ge=1, description="samples per shard; only the last may hold fewer")
    classes: list[str] = Field(min_length=1, max_length=1_000_000)
    shards: list[ShardInfo] = Field(min_length=1)
    mean_image_bytes_per_sample: float = Field(ge=0)
    mean_shard_bytes_per_sample: float = Field(gt=0)
    source: str = Field(default="", max_length=4096, description="where the samples came from")
    layout: DatasetLayout = Field(
        default=DatasetLayout.SHARDS, description="how the samples lie in Swift"
    )
    data_container: str | None = Field(
        default=None,
        description="container of the data objects (images or WebDataset tars) when it is not "
        "the manifest's own; the folder layout's part objects lie beside the manifest",
    )
    label_field: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="webdataset layout: the field of each sample's .json member that holds the "
        "label (None: the .cls or .txt member)",
    )
    skipped_objects: int = Field(
        default=0,
        ge=0,
        description="in-place layouts: objects under the indexed prefix left out of the dataset "
        "(not images, hidden, not named by the labels object, or not WebDataset shards)",
    )
    skipped_examples: list[str] = Field(
        default_factory=list,
        max_length=MAX_SKIPPED_EXAMPLES,
        description="the first skipped objects' names, in listing order",
    )

    @field_validator("name", "data_container")
    @classmethod
    def _name_pattern(cls, value: str | None) -> str | None:
        if value is not None and not _CONTAINER_RE.fullmatch(value):
            raise ValueError("container names are 1-256 characters without '/'")
        return value

    @field_validator("classes")
    @classmethod
    def _classes_unique(cls, value: list[str]) -> list[str]:
        if any(not name for name in value):
            raise ValueError("class names must be non-empty")
        if len(set(value)) != len(value):
            raise ValueError("class names must be unique")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DatasetManifest:
        if self.layout is DatasetLayout.SHARDS and self.data_container is not None:
            raise ValueError("data_container is for the in-place layouts only")
        if self.label_field is not None and self.layout is not DatasetLayout.WEBDATASET:
            raise ValueError("label_field is for the webdataset layout only")
        if self.layout is DatasetLayout.SHARDS and self.skipped_objects:
            raise ValueError("skipped_objects is for the in-place layouts only")
        if len(self.skipped_examples) > self.skipped_objects:
            raise ValueError("more skipped_examples than skipped_objects")
        any_size = self.layout is DatasetLayout.WEBDATASET
        expected_index = 0
        names: set[str] = set()
        for position, shard in enumerate(self.shards):
            if self.layout is DatasetLayout.SHARDS and shard.name != shard_name(position):
                raise ValueError(f"shard {position} must be named {shard_name(position)!r}")
            if shard.name in names:
                raise ValueError(f"shard {shard.name!r} is listed twice")
            names.add(shard.name)
            if shard.first_index != expected_index:
                raise ValueError(
                    f"shard {shard.name}: first_index {shard.first_index} != {expected_index}"
                )
            last = position == len(self.shards) - 1
            if shard.samples > self.shard_size or (
                not any_size and not last and shard.samples != self.shard_size
            ):
                rule = "at most" if any_size else "every shard but the last must hold exactly"
                raise ValueError(
                    f"shard {shard.name}: {shard.samples} samples; {rule} "
                    f"shard_size={self.shard_size}"
                )
            expected_index += shard.samples
        if expected_index != self.num_samples:
            raise ValueError(
                f"shards hold {expected_index} samples but num_samples={self.num_samples}"
            )
        image_mean = sum(s.image_bytes for s in self.shards) / self.num_samples
        shard_mean = (
            image_mean
            if self.layout is DatasetLayout.FOLDER
            else sum(s.bytes for s in self.shards) / self.num_samples
        )
        for field, stored, actual in (
            ("mean_image_bytes_per_sample", self.mean_image_bytes_per_sample, image_mean),
            ("mean_shard_bytes_per_sample", self.mean_shard_bytes_per_sample, shard_mean),
        ):
            if abs(stored - actual) > 1e-6 * max(1.0, actual):
                raise ValueError(f"{field}={stored} but the shards give {actual}")
        return self

    @classmethod
    def build(
        cls,
        *,
        name: str,
        classes: Iterable[str],
        shards: Iterable[ShardInfo],
        shard_size: int,
        source: str = "",
        layout: DatasetLayout = DatasetLayout.SHARDS,
        data_container: str | None = None,
        label_field: str | None = None,
        skipped_objects: int = 0,
        skipped_examples: Iterable[str] = (),
    ) -> DatasetManifest:
        """A manifest whose totals and means are computed from ``shards``.

        Raises:
            InvalidManifestError: the parts do not make a valid manifest.
        """
        shard_list = list(shards)
        num_samples = sum(s.samples for s in shard_list)
        divisor = max(num_samples, 1)
        image_mean = sum(s.image_bytes for s in shard_list) / divisor
        try:
            return cls(
                name=name,
                num_samples=num_samples,
                shard_size=shard_size,
                classes=list(classes),
                shards=shard_list,
                mean_image_bytes_per_sample=image_mean,
                mean_shard_bytes_per_sample=(
                    image_mean
                    if layout is DatasetLayout.FOLDER
                    else sum(s.bytes for s in shard_list) / divisor
                ),
                source=source,
                layout=layout,
                data_container=data_container,
                label_field=label_field,
                skipped_objects=skipped_objects,
                skipped_examples=list(skipped_examples),
            )
        except ValidationError as exc:
            raise InvalidManifestError(_describe(exc)) from exc

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    @property
    def total_bytes(self) -> int:
        """Bytes of data a full pass reads: the shard objects, or the images of a folder layout."""
        if self.layout is DatasetLayout.FOLDER:
            return sum(s.image_bytes for s in self.shards)
        return sum(s.bytes for s in self.shards)

    @property
    def data_location(self) -> str:
        """The container holding the data objects (images or tars): ``data_container`` or ``name``."""
        return self.data_container or self.name

    def shard_of(self, index: int) -> ShardInfo:
        """The shard holding global sample ``index`` (shards of any size: by ``first_index``)."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample index {index} out of range 0..{self.num_samples - 1}")
        starts = [s.first_index for s in self.shards]
        return self.shards[bisect.bisect_right(starts, index) - 1]

    def to_json(self) -> bytes:
        """Canonical UTF-8 JSON (stable key order, so equal manifests give equal bytes/etags).

        The in-place layouts' fields are left out at their defaults, so that a ``shards``
        manifest keeps the bytes (and etag) it had before they existed, and an in-place index
        that skipped nothing keeps those it had before ``skipped_objects`` existed.
        """
        unset = {
            field
            for field in (
                "layout",
                "data_container",
                "label_field",
                "skipped_objects",
                "skipped_examples",
            )
            if getattr(self, field)
            == type(self).model_fields[field].get_default(call_default_factory=True)
        }
        return (self.model_dump_json(indent=1, exclude=unset) + "\n").encode("utf-8")


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors()[:5]:
        location = ".".join(str(part) for part in error["loc"]) or "manifest"
        problems.append(f"{location}: {error['msg']}")
    more = exc.error_count() - len(problems)
    return "invalid manifest: " + "; ".join(problems) + (f" (+{more} more)" if more > 0 else "")


def parse_manifest(data: bytes | bytearray | memoryview | str) -> DatasetManifest:
    """Parse and validate manifest JSON.

    Raises:
        InvalidManifestError: too large, not JSON, or not a valid :class:`DatasetManifest`.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise InvalidManifestError(
            f"manifest of {len(data)} bytes exceeds the limit of {MAX_MANIFEST_BYTES} bytes"
        )
    raw = data if isinstance(data, str) else bytes(data)
    try:
        return DatasetManifest.model_validate_json(raw)
    except ValidationError as exc:
        raise InvalidManifestError(_describe(exc)) from exc
