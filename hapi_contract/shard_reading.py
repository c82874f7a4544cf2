"""Reading one shard's samples in any layout, written once for the server, the filter and the client.

A shard of an uploaded dataset is one strict tar; of a ``webdataset`` dataset one existing tar
read tolerantly; of a ``folder`` dataset a *part* object listing image objects that are each
read and checked against what the part pinned (:mod:`hapi_contract.layouts`). Which objects to
read and how to check them is the same wherever it runs, so it is written here as a sans-I/O
generator (:func:`read_shard_samples`): it *yields* what it needs (:class:`ReadObject`,
:class:`ReadObjects`, :class:`Parse`) and receives the answer. The extraction core performs these
with its own effects (as the caller, bounded concurrency, compute off the event loop); the
client's BASELINE mode and its pushdown verifier with its Swift session (:func:`run_shard_read`).

Errors are the contract's dataset errors, each naming the object and the cause:
:class:`~hapi_contract.layouts.ChangedObjectError` for an object that is not what was indexed
(size or MD5) or a shard that is not what its manifest recorded (its etag: :func:`check_pin`),
:class:`~hapi_contract.dataset.ShardFormatError` and
:class:`~hapi_contract.layouts.PartFormatError` for the rest, and :class:`TooManySamplesError`
for a shard over the reader's sample limit.

**Pins.** A manifest records every shard object's etag (the MD5 Swift reports: an uploaded
shard's, a WebDataset tar's, a folder part's), and a :class:`ShardSource` built from it carries
that etag; the shard is then read only while Swift still answers it: a shard overwritten since,
with the same samples or not, is refused naming it, never read as if it were the recorded one.
The etag checked is the one Swift sent with the bytes read, so the check costs no hashing and
no extra request, and no read can slip between the check and the bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hapi_contract.dataset import (
    DEFAULT_MAX_IMAGE_BYTES,
    DatasetFormatError,
    DatasetLayout,
    DatasetManifest,
    ShardSample,
    read_shard,
)
from hapi_contract.layouts import (
    ChangedObjectError,
    PartEntry,
    check_folder_object,
    parse_part,
    read_webdataset_shard,
)

__all__ = [
    "Parse",
    "ReadObject",
    "ReadObjects",
    "ShardRead",
    "ShardSource",
    "TooManySamplesError",
    "check_pin",
    "read_shard_samples",
    "run_shard_read",
]

T = TypeVar("T")


class TooManySamplesError(DatasetFormatError):
    """A shard holds more samples than the reader may take (a server answers it with a 413)."""


@dataclass(frozen=True)
class ReadObject:
    """Read ``container/name`` whole, at most ``max_bytes``; the answer is the pair of its bytes
    and the etag Swift sent with them (``""`` when it sent none), so that the reader can check a
    pinned shard (:func:`check_pin`)."""

    container: str
    name: str
    max_bytes: int


@dataclass(frozen=True)
class ReadObjects:
    """Read each of ``names`` in ``container``, each at most ``max_bytes_each``; the answer is
    their bytes in the order of ``names``. The reader may read several at once."""

    container: str
    names: tuple[str, ...]
    max_bytes_each: int


@dataclass(frozen=True)
class Parse:
    """Run ``work`` (CPU: parsing, hashing) where it does not block others; its return value."""

    work: Callable[[], Any]


ShardRead = Generator[ReadObject | ReadObjects | Parse, Any, T]


@dataclass(frozen=True)
class ShardSource:
    """Where one shard of a dataset lies and how to read it: what a request names.

    ``container`` holds the shard object (the tar, or for ``folder`` the part beside the
    manifest); ``data_container`` the image objects of a ``folder`` part. ``etag`` pins the
    shard object to the one its manifest recorded (None: read whatever is stored).
    """

    container: str
    shard: str
    layout: DatasetLayout = DatasetLayout.SHARDS
    data_container: str | None = None
    label_field: str | None = None
    etag: str | None = None

    @classmethod
    def of(cls, manifest: DatasetManifest, container: str, shard: int) -> ShardSource:
        """Shard ``shard`` of ``manifest``, whose manifest lies in ``container``, pinned to the
        etag the manifest recorded for it."""
        info = manifest.shards[shard]
        name, etag, layout = info.name, info.etag, manifest.layout
        if layout is DatasetLayout.WEBDATASET:
            # The user's tars are the shards: they lie in the data container.
            data = manifest.data_container or container
            return cls(data, name, layout, label_field=manifest.label_field, etag=etag)
        if layout is DatasetLayout.FOLDER:
            return cls(container, name, layout, data_container=manifest.data_container, etag=etag)
        return cls(container, name, etag=etag)

    def request_fields(self) -> dict[str, Any]:
        """What an extract or timings request names of its shard: where it lies, its layout
        and the etag it is pinned to (``ExtractRequest(**source.request_fields(), ...)``)."""
        return {
            "container": self.container,
            "shard": self.shard,
            "etag": self.etag,
            "layout": self.layout,
            "data_container": self.data_container,
            "label_field": self.label_field,
        }

    @property
    def where(self) -> str:
        """``container/shard``, as errors name it."""
        return f"{self.container}/{self.shard}"

    @property
    def image_container(self) -> str:
        """The container of a ``folder`` part's images."""
        return self.data_container or self.container

    def sample_name(self, key: str) -> str:
        """How errors name one sample of this shard by its ``key``: a ``folder`` image is its
        own object (``container/name``), any other sample the shard object and its key."""
        if self.layout is DatasetLayout.FOLDER:
            return f"{self.image_container}/{key}"
        return f"shard {self.where}: sample {key}"


def read_shard_samples(
    source: ShardSource,
    *,
    num_classes: int | None,
    max_samples: int,
    max_object_bytes: int,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    first: int | None = None,
) -> ShardRead[list[ShardSample]]:
    """The samples of ``source``'s shard in stored order, every one checked; with ``first``,
    only the first ``first`` of them (a ``folder`` part's other images are not read at all).

    ``max_object_bytes`` bounds what one shard reads: its tar, or the sum of a part's images as
    the part pins them (a part over it is a :class:`TooManySamplesError` before any image is
    read); ``max_image_bytes`` each image (a ``folder`` image grown past it is refused by the
    read itself, as too large).

    Raises:
        ChangedObjectError: the shard object is not the one pinned (``source.etag``), or a
            ``folder`` image is not the object that was indexed.
        TooManySamplesError: more than ``max_samples`` samples, or a part whose images sum to
            more than ``max_object_bytes``.
        DatasetFormatError: the shard, the part or an image is malformed (the message names it).
    """
    if source.layout is DatasetLayout.FOLDER:
        return (
            yield from _read_folder_part(
                source,
                num_classes=num_classes,
                max_samples=max_samples,
                max_object_bytes=max_object_bytes,
                max_image_bytes=max_image_bytes,
                first=first,
            )
        )
    data, etag = yield ReadObject(source.container, source.shard, max_object_bytes)
    check_pin(source, etag)
    where = source.where
    if source.layout is DatasetLayout.WEBDATASET:

        def parse() -> list[ShardSample]:
            # One more than the limit is read, so that "too many" is told apart by the count.
            return read_webdataset_shard(
                data,
                where,
                label_field=source.label_field,
                max_samples=max_samples + 1,
                max_image_bytes=max_image_bytes,
                num_classes=num_classes,
            )

    else:

        def parse() -> list[ShardSample]:
            try:
                # A tar member takes at least 512 bytes and a sample two, so this bound never
                # cuts a shard short: the limit is checked on the count below.
                return read_shard(data, max_samples=len(data) // 1024 + 1, num_classes=num_classes)
            except DatasetFormatError as exc:
                raise type(exc)(f"shard {where}: {exc}") from exc

    samples: list[ShardSample] = yield Parse(parse)
    _check_count(len(samples), max_samples, where)
    return samples if first is None else samples[:first]


def check_pin(source: ShardSource, etag: str) -> None:
    """Refuse ``source``'s shard object when ``etag`` (what Swift sent with its bytes) is not
    the one pinned, in the words a changed ``folder`` image is refused with.

    Raises:
        ChangedObjectError: the object was overwritten or replaced since its manifest was made.
    """
    if source.etag is None or etag == source.etag:
        return
    made, again = (
        ("uploaded", "upload") if source.layout is DatasetLayout.SHARDS else ("indexed", "index")
    )
    raise ChangedObjectError(
        f"{source.where} changed after it was {made} (etag {etag or 'none'}; {made}: etag "
        f"{source.etag}): {again} the dataset again"
    )


def _check_count(count: int, max_samples: int, where: str) -> None:
    if count > max_samples:
        raise TooManySamplesError(
            f"shard {where}: {count} samples, more than {max_samples} samples "
            "(max_samples_per_request)"
        )


def _read_folder_part(
    source: ShardSource,
    *,
    num_classes: int | None,
    max_samples: int,
    max_object_bytes: int,
    max_image_bytes: int,
    first: int | None = None,
) -> ShardRead[list[ShardSample]]:
    where = source.where
    # A part line is at most MAX_PART_LINE_BYTES; parse_part counts the lines.
    data, etag = yield ReadObject(source.container, source.shard, max_object_bytes)
    check_pin(source, etag)
    entries: list[PartEntry] = yield Parse(
        lambda: parse_part(
            data,
            where,
            max_entries=max_samples + 1,
            num_classes=num_classes,
            max_image_bytes=max_image_bytes,
        )
    )
    _check_count(len(entries), max_samples, where)
    total = sum(entry.bytes for entry in entries)
    if total > max_object_bytes:
        raise TooManySamplesError(
            f"part {where}: its images take {total} bytes, over the limit of "
            f"{max_object_bytes} bytes per request (max_object_bytes)"
        )
    if first is not None:
        entries = entries[:first]  # one GET per image: the others are never read
    images = source.image_container
    blobs: list[bytes] = yield ReadObjects(
        images, tuple(entry.name for entry in entries), max_image_bytes
    )
    checked: list[ShardSample] = yield Parse(lambda: _check_objects(entries, blobs, images))
    return checked


def _check_objects(
    entries: Sequence[PartEntry], blobs: Sequence[bytes], container: str
) -> list[ShardSample]:
    return [
        check_folder_object(entry, blob, f"{container}/{entry.name}")
        for entry, blob in zip(entries, blobs, strict=True)
    ]


def run_shard_read(
    read: ShardRead[T],
    get: Callable[[str, str, int], tuple[bytes, str]],
    get_many: Callable[[str, Sequence[str], int], list[bytes]],
) -> T:
    """Run ``read`` to its end with blocking reads: ``get(container, name, max_bytes)`` answers
    ``(bytes, etag)``, ``get_many(container, names, max_bytes_each)`` a list of bytes; parsing
    runs in the calling thread."""
    answer: Any = None
    while True:
        try:
            step = read.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        match step:
            case ReadObject(container, name, max_bytes):
                answer = get(container, name, max_bytes)
            case ReadObjects(container, names, max_bytes_each):
                answer = get_many(container, names, max_bytes_each)
            case Parse(work):
                answer = work()
