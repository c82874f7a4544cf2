"""Datasets indexed in place: the ``folder`` and ``webdataset`` layouts.

``hapi dataset index`` builds a :class:`~hapi_contract.dataset.DatasetManifest` for data that is
already in Swift and never writes, moves or rewrites a data object. Its ``layout`` says how the
samples lie (:class:`DatasetLayout`); ``data_container`` names the container of the data objects
(None: the manifest's own). Everything the manifest says of shards keeps its meaning in every
layout: ``first_index``/``samples`` place each shard's samples in the global order, so epochs,
resume, rank sharding and the feature cache work on the list of shards unchanged.

**webdataset**: each :class:`~hapi_contract.dataset.ShardInfo` is an existing tar object of the
data container, pinned by the ``bytes`` and ``etag`` Swift listed for it when it was indexed;
``image_bytes`` and ``samples`` are counted by reading it once. Shards may hold any number of
samples (``shard_size`` is the largest). :func:`read_webdataset_shard` reads one, tolerantly:

* a plain POSIX tar, or one gzip-compressed (found by its magic bytes, whatever the name); the
  decompressed size is bounded (``max_tar_bytes``), so a gzip bomb is refused, not expanded;
* members are grouped by key as WebDataset itself does (``webdataset.tariterators
  .base_plus_ext``): the key is the member's path up to the first ``.`` of its base name, the
  extension everything after it; members may come in any order;
* the image is the member with extension ``jpg``, ``jpeg``, ``png`` or ``webp`` (any case), its
  magic bytes checked; the label is the non-negative integer of the ``cls`` member, else of the
  ``txt`` member, or (with ``label_field``) the named top-level field of the ``json`` member;
  every other member (``seg.png``, ``__key__``, directories, links) is skipped unread;
* a sample without an image, without a label, with two images or two members of one extension
  is an error naming its key, never silently dropped; so are more than ``max_samples`` samples
  and an image above ``max_image_bytes``, as in the strict reader. Samples come in the order of
  their first member.

Which extensions Pillow (the decoder of :mod:`hapi_models`) reads: all four, WebP included.

**folder**: one object per image in the data container. The manifest's shards are *parts*:
objects the indexer writes beside the manifest (``hapi-index/part-000000.jsonl``, ...), each
pinned by its own ``bytes`` and ``etag``, and listing its samples in order, one JSON object per
line (UTF-8, ``\\n``-terminated, keys sorted, no spaces: :func:`write_part`)::

    {"bytes":110837,"etag":"3c5e...","label":0,"name":"train/n01440764/n01440764_10026.JPEG"}

``name`` is the image's object name in the data container, ``etag`` and ``bytes`` what Swift
listed for it when it was indexed (a plain object's MD5 and size: the reader compares the object
it gets against both and names any change, :func:`check_folder_object`), and ``label`` its class
index in the manifest's ``classes``. A part's ``image_bytes`` is the sum of its ``bytes``; every
part but the last holds ``shard_size`` images.

Object names (part entries and shard names alike) must satisfy
:func:`~hapi_contract.dataset.object_name_problem`: no control characters, no ``.``/``..``
segments, at most 1024 bytes. Large objects of Swift (SLO/DLO manifests) are refused when a
dataset is indexed: their listed etag is not the MD5 of their content, so they could not be
pinned (the indexer names them).
"""

from __future__ import annotations

import json
import re
import tarfile
import unicodedata
import zlib
from collections.abc import Iterable
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hapi_contract._tar_buffer import ImageData, member_bytes, open_tar
from hapi_contract.dataset import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_SHARD_SAMPLES,
    DatasetFormatError,
    DatasetLayout,
    ShardFormatError,
    ShardSample,
    md5_hex,
    object_name_problem,
)

__all__ = [
    "DEFAULT_MAX_TAR_BYTES",
    "GZIP_TRAILER_BYTES",
    "IN_PLACE_IMAGE_EXTENSIONS",
    "MAX_PART_LINE_BYTES",
    "PART_CONTENT_TYPE",
    "PART_PREFIX",
    "ChangedObjectError",
    "DatasetLayout",
    "PartEntry",
    "PartFormatError",
    "check_folder_object",
    "gzip_trailer_size",
    "image_kind_of",
    "image_kind_of_name",
    "parse_part",
    "part_name",
    "read_webdataset_shard",
    "write_part",
]

PART_PREFIX: Final = "hapi-index/"
PART_CONTENT_TYPE: Final = "application/jsonl"
#: A part line: a 1024-byte name (JSON-escaped: up to twice as long) and the other three fields.
MAX_PART_LINE_BYTES: Final = 4096
#: Decompressed (or plain) tar bytes :func:`read_webdataset_shard` accepts by default: the size
#: WebDataset's own guidance gives as the upper end for a shard.
DEFAULT_MAX_TAR_BYTES: Final = 1024**3
#: The bytes at the end of a gzip stream that state its decompressed size (RFC 1952's ISIZE).
GZIP_TRAILER_BYTES: Final = 4
#: Image extensions of the in-place layouts (lowercase; matched case-insensitively).
IN_PLACE_IMAGE_EXTENSIONS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp")

# jpeg is stored as jpg: ShardSample.ext names the kind of image, not the spelling of a name.
_KIND_OF_EXTENSION: Final = {"jpg": "jpg", "jpeg": "jpg", "png": "png", "webp": "webp"}
_LABEL_EXTENSIONS: Final = ("cls", "txt")
_JSON_EXTENSION: Final = "json"
_MAX_LABEL_MEMBER_BYTES: Final = 32
_MAX_JSON_MEMBER_BYTES: Final = 64 * 1024
# Per sample: an image, a label and a few extra members (masks, captions, metadata).
_MAX_MEMBERS_PER_SAMPLE: Final = 32
_LABEL_RE = re.compile(rb"\s*([0-9]{1,9})\s*")
_ETAG_RE = re.compile(r"[0-9a-f]{32}")
# webdataset.tariterators.base_plus_ext: directories stay in the key; the key ends at the first
# dot of the base name.
_BASE_PLUS_EXT_RE = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$", re.DOTALL)
_GZIP_MAGIC: Final = b"\x1f\x8b"
#: Member names and extensions an error about a shard without samples quotes.
_SKIPPED_EXAMPLES: Final = 3
_READ_CHUNK: Final = 1024 * 1024
_END_MARKER_BYTES: Final = 2 * tarfile.BLOCKSIZE


class PartFormatError(DatasetFormatError):
    """A folder layout's part object is malformed: the message names the line and the cause."""


class ChangedObjectError(DatasetFormatError):
    """An indexed object is not what was indexed (size, MD5 or content): changed since."""


def image_kind_of(data: bytes | bytearray | memoryview) -> str | None:
    """``"jpg"``, ``"png"`` or ``"webp"`` from the leading magic bytes of ``data``; else None."""
    head = bytes(data[:12])
    if head.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def image_kind_of_name(name: str) -> str | None:
    """The image kind (``jpg``/``png``/``webp``) an object name's extension promises, or None."""
    _, dot, ext = name.rpartition(".")
    if not dot or "/" in ext:
        return None
    return _KIND_OF_EXTENSION.get(ext.lower())


def part_name(index: int) -> str:
    """Object name of part number ``index`` of a folder layout: ``hapi-index/part-000042.jsonl``."""
    if index < 0:
        raise ValueError(f"part index must be >= 0, got {index}")
    return f"{PART_PREFIX}part-{index:06d}.jsonl"


class PartEntry(BaseModel):
    """One image of a folder layout's part: its object, as listed when indexed, and its label."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="object name in the data container")
    etag: str = Field(description="the object's MD5, lowercase hex, from the listing")
    bytes: int = Field(ge=1, description="the object's size from the listing")
    label: int = Field(ge=0, description="class index into the manifest's classes")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        problem = object_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        if image_kind_of_name(value) is None:
            raise ValueError(
                "not an image name (extensions: " + ", ".join(IN_PLACE_IMAGE_EXTENSIONS) + ")"
            )
        return value

    @field_validator("etag")
    @classmethod
    def _etag_ok(cls, value: str) -> str:
        if not _ETAG_RE.fullmatch(value):
            raise ValueError(f"etag {value!r} is not 32 lowercase hex digits")
        return value


def write_part(entries: Iterable[PartEntry]) -> bytes:
    """The bytes of a part object: one canonical JSON line per entry, in order (deterministic)."""
    lines = [
        json.dumps(entry.model_dump(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        + "\n"
        for entry in entries
    ]
    return "".join(lines).encode("utf-8")


def _entry_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    location = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{location}: {message}" if location else message


def parse_part(
    data: bytes | bytearray | memoryview,
    where: str,
    *,
    max_entries: int = DEFAULT_MAX_SHARD_SAMPLES,
    num_classes: int | None = None,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
) -> list[PartEntry]:
    """The entries of a part object, validated; ``where`` (the part's name) leads every error.

    Raises:
        PartFormatError: not UTF-8, a line that is not JSON or not a :class:`PartEntry` (dot
            segments or control characters in a name, no image extension, a bad etag, zero
            ``bytes``), ``bytes`` above ``max_image_bytes``, a label not below ``num_classes``,
            a name listed twice, more than ``max_entries`` entries, or no entry at all.
    """
    raw = bytes(data)
    if raw and not raw.endswith(b"\n"):
        raise PartFormatError(f"{where}: truncated (the last line has no newline)")
    lines = raw.split(b"\n")[:-1] if raw else []
    if not lines:
        raise PartFormatError(f"{where}: part lists no images")
    if len(lines) > max_entries:
        raise PartFormatError(f"{where}: {len(lines)} entries exceed the limit of {max_entries}")
    entries: list[PartEntry] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        at = f"{where} line {number}"
        if len(line) > MAX_PART_LINE_BYTES:
            raise PartFormatError(f"{at}: longer than {MAX_PART_LINE_BYTES} bytes")
        try:
            fields = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PartFormatError(f"{at}: not a UTF-8 JSON object ({exc})") from exc
        if not isinstance(fields, dict):
            raise PartFormatError(f"{at}: not a JSON object")
        try:
            entry = PartEntry.model_validate(fields, strict=True)
        except ValidationError as exc:
            raise PartFormatError(f"{at}: {_entry_problem(exc)}") from exc
        if entry.bytes > max_image_bytes:
            raise PartFormatError(
                f"{at}: {entry.name!r} is {entry.bytes} bytes, above the limit of "
                f"{max_image_bytes} bytes per image"
            )
        if num_classes is not None and entry.label >= num_classes:
            raise PartFormatError(
                f"{at}: {entry.name!r} has label {entry.label}, out of range for "
                f"{num_classes} classes"
            )
        if entry.name in seen:
            raise PartFormatError(f"{at}: {entry.name!r} is listed twice")
        seen.add(entry.name)
        entries.append(entry)
    return entries


def check_folder_object(
    entry: PartEntry, data: bytes | bytearray | memoryview, where: str
) -> ShardSample:
    """The sample of one folder-layout image, checked against what its part pinned.

    ``where`` names the object (``container/name``) in the errors.

    Raises:
        ChangedObjectError: its size or MD5 differs from the part entry (changed after indexing).
        ShardFormatError: its bytes are not the image its extension names.
    """
    if len(data) != entry.bytes or md5_hex(data) != entry.etag:
        raise ChangedObjectError(
            f"{where} changed after it was indexed ({len(data)} bytes, md5 {md5_hex(data)}; "
            f"indexed: {entry.bytes} bytes, md5 {entry.etag}): index the dataset again"
        )
    kind = image_kind_of_name(entry.name)
    found = image_kind_of(data)
    if kind is None or found != kind:
        detail = f"looks like {found}" if found else "is not a JPEG, PNG or WebP image"
        raise ShardFormatError(f"{where}: not the image its name promises ({detail})")
    # Handed on as read, never copied: a copy held a folder part's images twice while the
    # reads' buffers were alive (the in-proxy reads are bytearrays: two requests of a 988 MB
    # part raised the proxy's resident memory by 1882 MiB, issue 27). Only a view is copied:
    # its buffer is the caller's, who may reuse it.
    image = data if isinstance(data, bytes | bytearray) else bytes(data)
    return ShardSample(entry.name, image, kind, entry.label)


def gzip_trailer_size(tail: ImageData) -> int:
    """What a gzip stream ending in ``tail`` says it decompresses to: its trailer's ISIZE (the
    size modulo 2**32, of its last member); 0 for fewer than 4 bytes, and for a plain tar,
    which ends in zero blocks. A server reads these 4 bytes (a ranged GET) to plan a shard's
    decompression before reading it (issue 27)."""
    return int.from_bytes(bytes(tail[-GZIP_TRAILER_BYTES:]), "little") if len(tail) >= 4 else 0


def _decompressed(data: ImageData, limit: int) -> ImageData:
    """``data`` itself, or its gzip decompression (handed on without a copy), refusing more
    than ``limit`` and more than the gzip trailer states (:func:`gzip_trailer_size`, what a
    server planned for it: a stream of several gzip members states only its last one's)."""
    if not bytes(data[: len(_GZIP_MAGIC)]).startswith(_GZIP_MAGIC):
        if len(data) > limit:
            raise ShardFormatError(f"tar of {len(data)} bytes exceeds the limit of {limit} bytes")
        return data
    stated = gzip_trailer_size(data)
    if stated < limit:
        limit, why = (
            stated,
            (
                f"the {stated} bytes its gzip trailer states (a stream of several gzip members, or a "
                "corrupt one: store the tar as one gzip stream, or uncompressed)"
            ),
        )
    else:
        why = f"the limit of {limit} bytes (a decompression bomb, or a shard too large)"
    out = bytearray()
    rest: ImageData = data
    try:
        while bytes(rest[: len(_GZIP_MAGIC)]).startswith(_GZIP_MAGIC):
            stream = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
            pending = rest
            while pending and not stream.eof:
                out += stream.decompress(pending, _READ_CHUNK)
                pending = stream.unconsumed_tail
                if len(out) > limit:
                    raise ShardFormatError(f"gzip stream expands beyond {why}")
            if not stream.eof:
                raise ShardFormatError("truncated gzip stream")
            rest = stream.unused_data
    except zlib.error as exc:
        raise ShardFormatError(f"corrupt gzip stream: {exc}") from exc
    if bytes(rest).strip(b"\0"):
        raise ShardFormatError("data after the end of the gzip stream")
    return out


def _integer_label(payload: bytes, key: str, member: str) -> int:
    match = _LABEL_RE.fullmatch(payload)
    if match is None:
        raise ShardFormatError(
            f"sample {key!r}: bad label {payload[:16]!r} in its .{member} member "
            "(expected a non-negative integer)"
        )
    return int(match.group(1))


def _json_label(payload: bytes, key: str, field: str) -> int:
    try:
        document = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardFormatError(f"sample {key!r}: its .json member is not JSON ({exc})") from exc
    if not isinstance(document, dict) or field not in document:
        raise ShardFormatError(f"sample {key!r}: its .json member has no field {field!r}")
    value = document[field]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**9:
        raise ShardFormatError(
            f"sample {key!r}: field {field!r} of its .json member is {value!r}, not a "
            "non-negative integer label"
        )
    return value


def _member_limit(ext: str, max_image_bytes: int) -> int:
    if ext in _LABEL_EXTENSIONS:
        return _MAX_LABEL_MEMBER_BYTES
    if ext == _JSON_EXTENSION:
        return _MAX_JSON_MEMBER_BYTES
    return max_image_bytes


def read_webdataset_shard(
    data: bytes | bytearray | memoryview,
    where: str,
    *,
    label_field: str | None = None,
    max_samples: int = DEFAULT_MAX_SHARD_SAMPLES,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    max_tar_bytes: int | None = None,
    num_classes: int | None = None,
) -> list[ShardSample]:
    """The samples of an existing WebDataset shard, in the order of their first member.

    The format accepted is the module docstring's. ``where`` (the shard's object name) leads
    every error; ``max_tar_bytes`` (default :data:`DEFAULT_MAX_TAR_BYTES`) bounds the tar,
    decompressed.

    Raises:
        ShardFormatError: not a tar (or gzip of one), corrupt or truncated, too large once
            decompressed, too many samples or members, an image above ``max_image_bytes`` or
            whose bytes do not match its extension, a sample without image or label, with two
            images or a repeated member, a bad label, a label not below ``num_classes``.
    """
    limit = DEFAULT_MAX_TAR_BYTES if max_tar_bytes is None else max_tar_bytes
    label_exts: tuple[str, ...] = (_JSON_EXTENSION,) if label_field else _LABEL_EXTENSIONS
    try:
        raw = _decompressed(data, limit)
    except ShardFormatError as exc:
        raise ShardFormatError(f"{where}: {exc}") from exc
    groups: dict[str, dict[str, ImageData]] = {}
    members = 0
    # What was skipped, for the error of a shard with no samples (keys with dots, say).
    unwanted_names: list[str] = []
    unwanted_exts: dict[str, None] = {}
    try:
        tar, view = open_tar(raw)
    except (tarfile.TarError, EOFError) as exc:
        raise ShardFormatError(f"{where}: not a tar archive: {exc}") from exc
    try:
        with tar:
            while (member := tar.next()) is not None:
                members += 1
                if members > max_samples * _MAX_MEMBERS_PER_SAMPLE:
                    raise ShardFormatError(
                        f"{where}: more than {max_samples * _MAX_MEMBERS_PER_SAMPLE} members"
                    )
                match = _BASE_PLUS_EXT_RE.match(member.name)
                if not member.isreg() or member.issparse():
                    continue
                key, ext = (match.group(1), match.group(2).lower()) if match else ("", "")
                wanted = ext in _KIND_OF_EXTENSION or ext in label_exts
                if not wanted:
                    if len(unwanted_names) < _SKIPPED_EXAMPLES:
                        unwanted_names.append(member.name)
                    if len(unwanted_exts) < _SKIPPED_EXAMPLES:
                        unwanted_exts[ext] = None
                    continue
                # Keys are never paths here (nothing is extracted): only what would garble
                # messages and logs is refused.
                if any(unicodedata.category(char) == "Cc" for char in key):
                    raise ShardFormatError(
                        f"{where}: member {member.name!r}: control character in the key"
                    )
                parts = groups.get(key)
                if parts is None:
                    if len(groups) >= max_samples:
                        raise ShardFormatError(
                            f"{where}: member {member.name!r}: more than {max_samples} samples"
                        )
                    parts = groups[key] = {}
                if ext in parts:
                    raise ShardFormatError(f"{where}: sample {key!r} has two .{ext} members")
                if ext in _KIND_OF_EXTENSION and any(e in _KIND_OF_EXTENSION for e in parts):
                    raise ShardFormatError(f"{where}: sample {key!r} has two images")
                cap = _member_limit(ext, max_image_bytes)
                if member.size > cap:
                    raise ShardFormatError(
                        f"{where}: member {member.name!r}: {member.size} bytes exceeds the "
                        f"limit of {cap} bytes"
                    )
                payload = member_bytes(view, member)
                if len(payload) != member.size:
                    raise ShardFormatError(f"{where}: member {member.name!r}: truncated archive")
                # A label is a few bytes, parsed at once; an image stays a view of the shard.
                parts[ext] = payload if ext in _KIND_OF_EXTENSION else bytes(payload)
            # tarfile stops quietly at a garbled header after the first member, so require the
            # end-of-archive marker right after the last one, as the strict reader does.
            end = tar.offset
            marker = bytes(view[end : end + _END_MARKER_BYTES])
            if len(marker) < _END_MARKER_BYTES or marker.count(0) != _END_MARKER_BYTES:
                raise ShardFormatError(
                    f"{where}: truncated or corrupt archive: no end-of-archive marker at byte {end}"
                )
    except (tarfile.TarError, EOFError) as exc:
        raise ShardFormatError(f"{where}: corrupt tar archive: {exc}") from exc
    samples = [
        _sample(key, parts, where, label_field, num_classes) for key, parts in groups.items()
    ]
    if not samples:
        raise ShardFormatError(_no_samples(where, members, unwanted_names, list(unwanted_exts)))
    return samples


def _no_samples(where: str, members: int, names: list[str], exts: list[str]) -> str:
    """The error of a shard without samples, saying what it holds instead."""
    if not names:
        return f"{where}: shard contains no samples ({members} members, none a regular file)"
    return (
        f"{where}: shard contains no samples: WebDataset splits a member name into key and "
        "extension at the first dot of its base name, and none of the "
        f"{members} members has an image ({', '.join(IN_PLACE_IMAGE_EXTENSIONS)}) or label "
        f"extension that way; found e.g. {', '.join(repr(name) for name in names)} "
        f"(extensions {', '.join(repr(ext) for ext in exts)}): keys must hold no dot "
        "(rename the members, e.g. 'a.b.c61.jpeg' to 'a_b_c61.jpeg')"
    )


def _sample(
    key: str,
    parts: dict[str, ImageData],
    where: str,
    label_field: str | None,
    num_classes: int | None,
) -> ShardSample:
    images = [ext for ext in parts if ext in _KIND_OF_EXTENSION]
    if not images:
        raise ShardFormatError(
            f"{where}: sample {key!r} has no image member "
            f"({', '.join('.' + e for e in IN_PLACE_IMAGE_EXTENSIONS)})"
        )
    if label_field is not None:
        if _JSON_EXTENSION not in parts:
            raise ShardFormatError(f"{where}: sample {key!r} has no .json member for its label")
        try:
            label = _json_label(bytes(parts[_JSON_EXTENSION]), key, label_field)
        except ShardFormatError as exc:
            raise ShardFormatError(f"{where}: {exc}") from exc
    else:
        found = next((ext for ext in _LABEL_EXTENSIONS if ext in parts), None)
        if found is None:
            raise ShardFormatError(f"{where}: sample {key!r} has no .cls or .txt label member")
        try:
            label = _integer_label(bytes(parts[found]), key, found)
        except ShardFormatError as exc:
            raise ShardFormatError(f"{where}: {exc}") from exc
    if num_classes is not None and label >= num_classes:
        raise ShardFormatError(
            f"{where}: sample {key!r}: label {label} out of range for {num_classes} classes"
        )
    kind = _KIND_OF_EXTENSION[images[0]]
    image = parts[images[0]]
    found_kind = image_kind_of(image)
    if found_kind != kind:
        detail = f"looks like {found_kind}" if found_kind else "is not a JPEG, PNG or WebP image"
        raise ShardFormatError(
            f"{where}: sample {key!r}: image bytes do not match extension {images[0]!r} ({detail})"
        )
    return ShardSample(key, image, kind, label)
