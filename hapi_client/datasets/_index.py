"""Index data already in Swift, in place: a manifest for it, and nothing else written.

The indexer lists the data container page by page (Swift returns at most 10,000 names a page;
the listing's ``marker`` continues it), pins every object's ETag and size as listed (no HEAD per
object), and writes into the manifest container (default: the data container) only what the
formats of :mod:`hapi_contract.layouts` need: the folder layout's part objects
(``hapi-index/part-NNNNNN.jsonl``) and ``manifest.json``. It never writes, moves or rewrites a
data object; the only objects it deletes are its own (an earlier manifest of an in-place index,
before its parts change, and parts a shorter index no longer lists).

* **folder**: images are ``PREFIX<class>/**/<name>.{jpg,jpeg,png,webp}`` (any case), or the
  objects a labels object names (:mod:`._labels_file`; then objects it does not name are skipped
  and counted). Without a labels object, other objects (``README.txt``, ``Thumbs.db``) and
  hidden ones (a name or folder starting with ``.``: ``.DS_Store``, ``._a.jpg``) are skipped, as
  torchvision's ``ImageFolder`` skips names without an image extension; ``strict`` refuses them
  instead, all those of a listing page at once. An object that is an image by its name is never
  skipped: empty, too large, or (when read) corrupt, it is refused, named. Classes are sorted by name, as torchvision's ``ImageFolder`` sorts them. Images
  are dealt into parts of ``shard_size`` in an order fixed by a keyed hash of each name: a part
  is then a sample of every class, not a run of one (an epoch shuffles the order of parts and the
  samples inside each, but a training batch comes from a few parts, so parts cut from the sorted
  listing would give one-class batches and one-class ranks); the order depends on the names
  only, not on the listing's pagination, so every run gives the same parts.
* **webdataset**: shards are the ``PREFIX**.tar``, ``.tar.gz`` and ``.tgz`` objects (other
  objects, and hidden ones, are skipped and counted, or refused if ``strict``), in listing order; each is read once, as the caller, with the
  tolerant reader, to count its samples and image bytes and collect its labels. Classes are
  ``"0"`` .. the largest label.

Skipped objects are counted, and the first of them named, in the result and in the manifest
(``skipped_objects``, ``skipped_examples``). Interrupted runs continue: the listing is spooled to a local file page by page and each finished
part or shard recorded (:mod:`._index_state`); memory holds a page, the class names, a labels map
if one is given, and 20 bytes per image for the deal, not the listing.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from swiftclient.client import Connection
from tqdm import tqdm

from hapi_contract.dataset import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_SHARD_SIZE,
    MANIFEST_CONTENT_TYPE,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    DatasetFormatError,
    DatasetLayout,
    DatasetManifest,
    InvalidManifestError,
    ShardInfo,
    md5_hex,
    object_name_problem,
    parse_manifest,
)
from hapi_contract.layouts import (
    DEFAULT_MAX_TAR_BYTES,
    IN_PLACE_IMAGE_EXTENSIONS,
    PART_CONTENT_TYPE,
    PART_PREFIX,
    PartEntry,
    image_kind_of_name,
    part_name,
    read_webdataset_shard,
    write_part,
)

from ._index_state import IndexState, default_state_dir
from ._labels_file import parse_labels
from ._listing import SWIFT_LISTING_LIMIT, IndexStore, ListingEntry, SwiftIndexStore
from ._swift import swift_errors
from ._upload import _check_container
from .errors import DatasetError, DatasetIndexError, IndexInterruptedError

__all__ = [
    "IndexRequest",
    "IndexResult",
    "StopCheck",
    "index_dataset",
    "run_index",
    "sync_index",
]

logger = logging.getLogger(__name__)

#: ``stop(phase, count)``, asked after each listing page (``"listing"``, pages so far) and each
#: part or shard (``"parts"``/``"shards"``, done so far): True stops the run there, resumably.
StopCheck = Callable[[str, int], bool]

_ETAG_RE = re.compile(r"[0-9a-f]{32}")
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_TAB = b"\t"


@dataclass(frozen=True)
class IndexRequest:
    """What to index, and where to put the manifest."""

    container: str
    layout: DatasetLayout
    prefix: str = ""
    labels: str | None = None
    label_field: str | None = None
    into: str | None = None
    shard_size: int = DEFAULT_SHARD_SIZE
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    seed: int = 0
    strict: bool = False

    def __post_init__(self) -> None:
        try:
            layout = DatasetLayout(self.layout)
        except ValueError:
            raise DatasetError(
                f"unknown layout {self.layout!r} (layouts: {', '.join(DatasetLayout)})"
            ) from None
        object.__setattr__(self, "layout", layout)
        # A prefix is a folder: "train" must not also take "train2/".
        if self.prefix and not self.prefix.endswith("/"):
            object.__setattr__(self, "prefix", self.prefix + "/")
        for container in (self.container, self.manifest_container):
            _check_container(container)
        if layout is DatasetLayout.SHARDS:
            raise DatasetError("the shards layout is uploaded (`hapi upload dataset`), not indexed")
        if self.labels is not None and layout is not DatasetLayout.FOLDER:
            raise DatasetError("a labels object is for the folder layout")
        if self.label_field is not None and layout is not DatasetLayout.WEBDATASET:
            raise DatasetError("a label field is for the webdataset layout")
        if self.shard_size < 1:
            raise DatasetError(f"shard size must be >= 1, got {self.shard_size}")
        if self.prefix and object_name_problem(self.prefix) is not None:
            raise DatasetError(f"prefix {self.prefix!r}: {object_name_problem(self.prefix)}")

    @property
    def manifest_container(self) -> str:
        """Where the manifest (and the parts) go: ``into``, else the data container."""
        return self.into or self.container

    @property
    def in_data_container(self) -> bool:
        """Whether the manifest goes into the data container itself."""
        return self.manifest_container == self.container

    def fingerprint(self, account: str) -> dict[str, Any]:
        """What identifies a run, for its resumable state (``account``: the storage URL)."""
        return {"account": account, **asdict(self), "layout": str(self.layout)}


@dataclass(frozen=True)
class IndexResult:
    """What :func:`sync_index` did."""

    manifest: DatasetManifest
    objects_listed: int
    objects_skipped: int
    skipped_examples: tuple[str, ...]
    parts_written: int
    manifest_written: bool
    stale_deleted: tuple[str, ...]
    resumed: bool
    seconds: float


def _hidden(relative: str) -> bool:
    """Whether a name (below the prefix) is hidden: a segment starts with a dot.

    ``.`` and ``..`` segments are not hidden but bad names, refused as such.
    """
    return any(part.startswith(".") and part not in (".", "..") for part in relative.split("/"))


def _refuse(message: str, name: str | None) -> DatasetIndexError:
    return DatasetIndexError(message, object_name=name)


class _Run:
    """One run of the indexer over a store; see :func:`run_index`."""

    def __init__(
        self,
        store: IndexStore,
        request: IndexRequest,
        state: IndexState,
        *,
        progress: bool,
        stop: StopCheck | None,
        page_size: int,
    ) -> None:
        self.store = store
        self.request = request
        self.state = state
        self.progress = progress
        self.stop = stop
        self.page_size = page_size
        self.where = f"{request.container}/{request.prefix}"
        self.labels: dict[str, str] | None = None
        self.listed = 0
        # The current listing page's skipped objects, and those ``strict`` refuses.
        self.page_skipped: list[str] = []
        self.page_refused: list[str] = []
        self.old_manifest = False
        self.parts_written = 0

    # -- the manifest container ------------------------------------------------------------

    def check_manifest_container(self) -> None:
        """Refuse to replace anything but an earlier in-place index's manifest."""
        into = self.request.manifest_container
        if not self.request.in_data_container:
            self.store.ensure_container(into)
        if not self.store.exists(into, MANIFEST_NAME):
            return
        try:
            existing = parse_manifest(self.store.read(into, MANIFEST_NAME))
        except InvalidManifestError as exc:
            raise _refuse(
                f"{into}/{MANIFEST_NAME} exists and is not a manifest HAPI can read ({exc}); "
                "delete it or index into another container (--into)",
                MANIFEST_NAME,
            ) from exc
        if existing.layout is DatasetLayout.SHARDS:
            raise _refuse(
                f"{into} holds an uploaded dataset ({MANIFEST_NAME} of the shards layout): "
                "index into another container (--into)",
                MANIFEST_NAME,
            )
        self.old_manifest = True

    def drop_old_manifest(self) -> None:
        """Before the first part changes: a reader then sees no dataset, never a stale one."""
        if self.old_manifest:
            logger.info("%s: the index changes; removing its old manifest first", self.where)
            self.store.delete(self.request.manifest_container, MANIFEST_NAME)
            self.old_manifest = False

    # -- phase 1: the listing --------------------------------------------------------------

    def load_labels(self) -> None:
        request = self.request
        if request.labels is None:
            return
        where = f"{request.container}/{request.labels}"
        self.labels = parse_labels(self.store.read_chunks(request.container, request.labels), where)
        for _, line in self.state.listing():  # resumed: these were matched before
            self.labels.pop(line.split(_TAB, 1)[0].decode("utf-8"), None)

    def own_object(self, name: str) -> bool:
        if not self.request.in_data_container:
            return False
        return name == MANIFEST_NAME or name.startswith(PART_PREFIX) or name == self.request.labels

    def skip(self, name: str) -> None:
        """Leave ``name`` out of the dataset (``strict``: refuse it, with the page's others)."""
        (self.page_refused if self.request.strict else self.page_skipped).append(name)

    def folder_line(self, entry: ListingEntry) -> str | None:
        request, name = self.request, entry.name
        relative = name[len(request.prefix) :]
        hidden = _hidden(relative)
        if name.endswith("/") and entry.bytes == 0:
            # A pseudo-directory marker: it names a class folder, which must then hold images.
            folder = relative.split("/")[0]
            named = folder and not hidden and self.labels is None
            return f"{name}\t\t0\t{folder}\n" if named else None
        label: str | None
        if self.labels is not None:
            label = self.labels.pop(name, None)
            if label is None:  # not in the dataset the labels object describes
                self.page_skipped.append(name)
                return None
        elif hidden or image_kind_of_name(name) is None:
            # What ImageFolder users expect: stray files beside the images are not samples.
            self.skip(name)
            return None
        self.check_object(entry)
        if image_kind_of_name(name) is None:  # named by the labels object
            raise _refuse(
                f"{request.container}/{name}: named by {request.labels}, but not an image "
                f"(extensions: {', '.join(IN_PLACE_IMAGE_EXTENSIONS)}, any case)",
                name,
            )
        if entry.bytes > request.max_image_bytes:
            raise _refuse(
                f"{request.container}/{name}: {entry.bytes} bytes, above the limit of "
                f"{request.max_image_bytes} bytes per image",
                name,
            )
        if self.labels is None:
            folder, slash, _ = relative.partition("/")
            if not slash or not folder:
                raise _refuse(
                    f"{request.container}/{name}: not in a class folder "
                    f"({request.prefix}<class>/...); name the classes in a labels object instead",
                    name,
                )
            label = folder
        return f"{name}\t{entry.etag}\t{entry.bytes}\t{label}\n"

    def webdataset_line(self, entry: ListingEntry) -> str | None:
        name = entry.name
        if name.endswith("/"):
            return None
        hidden = _hidden(name[len(self.request.prefix) :])
        if hidden or not name.lower().endswith(_TAR_SUFFIXES):
            self.skip(name)
            return None
        self.check_object(entry)
        if entry.bytes > DEFAULT_MAX_TAR_BYTES:
            raise _refuse(
                f"{self.request.container}/{entry.name}: {entry.bytes} bytes, above the limit of "
                f"{DEFAULT_MAX_TAR_BYTES} bytes per shard",
                entry.name,
            )
        return f"{entry.name}\t{entry.etag}\t{entry.bytes}\t\n"

    def check_object(self, entry: ListingEntry) -> None:
        """What every indexed object must be: a sane name, a plain object, not empty."""
        name, where = entry.name, f"{self.request.container}/{entry.name!r}"
        problem = object_name_problem(name)
        if problem is not None:
            raise _refuse(f"{where}: {problem}", name)
        if entry.large:
            # An SLO's listed etag is not the MD5 of its content: the reader could not check it.
            raise _refuse(
                f"{where}: a static large object (SLO manifest); its content cannot be pinned "
                "by an MD5: store it as a plain object",
                name,
            )
        if entry.bytes == 0:
            raise _refuse(f"{where}: zero bytes (an empty object, or a DLO manifest)", name)
        if not _ETAG_RE.fullmatch(entry.etag):
            raise _refuse(
                f"{where}: listed etag {entry.etag!r} is not an MD5 (a large or encrypted "
                "object?); it cannot be pinned",
                name,
            )

    def list_container(self) -> None:
        request, state = self.request, self.state
        to_line = (
            self.folder_line if request.layout is DatasetLayout.FOLDER else self.webdataset_line
        )
        pages = 0
        with tqdm(
            desc=f"list {self.where}",
            unit=" names",
            disable=not self.progress,
            leave=False,
        ) as bar:
            while not state.listing_complete:
                page = self.store.list_page(
                    request.container, request.prefix, state.marker, self.page_size
                )
                lines = []
                self.page_skipped, self.page_refused = [], []
                for entry in page:
                    if self.own_object(entry.name):
                        continue
                    line = to_line(entry)
                    if line is not None:
                        lines.append(line)
                if self.page_refused:
                    raise self.refuse_others(self.page_refused)
                complete = len(page) < self.page_size
                state.append_page(
                    lines,
                    page[-1].name if page else state.marker,
                    complete=complete,
                    skipped=self.page_skipped,
                )
                pages += 1
                self.listed += len(page)
                bar.update(len(page))
                if not complete and self.stop is not None and self.stop("listing", pages):
                    raise IndexInterruptedError(
                        f"indexing {self.where} stopped after listing {pages} pages; run it "
                        "again to continue"
                    )
        if self.labels:
            missing = sorted(self.labels)
            raise _refuse(
                f"{request.container}/{request.labels} names {len(missing)} objects that are not "
                f"under {self.where!r}, e.g. {missing[:3]}",
                missing[0],
            )

    def refuse_others(self, names: list[str]) -> DatasetIndexError:
        """The ``strict`` refusal of a page's objects that are not images (or shards)."""
        request = self.request
        if request.layout is DatasetLayout.FOLDER:
            what = f"images ({', '.join(IN_PLACE_IMAGE_EXTENSIONS)}, any case)"
        else:
            what = f"WebDataset shards ({', '.join('*' + s for s in _TAR_SUFFIXES)})"
        shown = ", ".join(repr(name) for name in names[:10])
        more = f" and {len(names) - 10} more" if len(names) > 10 else ""
        return _refuse(
            f"{request.container}: {len(names)} objects under {self.where!r} are hidden or not "
            f"{what}: {shown}{more}; delete or move them, narrow --prefix, or index without "
            "--strict to skip them",
            names[0],
        )

    # -- phase 2, folder: deal the images into parts and write them --------------------------

    def folder_parts(self) -> tuple[list[str], list[ShardInfo]]:
        request, state = self.request, self.state
        salt = f"hapi-index-{request.seed}".encode()
        keys, offsets, lengths = array("Q"), array("Q"), array("I")
        counts: Counter[bytes] = Counter()
        markers: set[bytes] = set()
        for offset, line in state.listing():
            name, etag, _, label = line.split(_TAB)
            if not etag:
                markers.add(label)
                continue
            counts[label] += 1
            digest = hashlib.blake2b(name, digest_size=8, key=salt).digest()
            keys.append(int.from_bytes(digest, "big"))
            offsets.append(offset)
            lengths.append(len(line))
        if not keys:
            raise _refuse(f"nothing to index under {self.where!r}", None)
        empty = sorted(markers - counts.keys())
        if empty:
            raise _refuse(
                f"class folder {request.prefix}{empty[0].decode()}/ holds no images"
                + (f" (and {len(empty) - 1} more classes)" if len(empty) > 1 else ""),
                f"{request.prefix}{empty[0].decode()}/",
            )
        classes = sorted(label.decode("utf-8") for label in counts)
        index_of = {name.encode("utf-8"): i for i, name in enumerate(classes)}
        order = np.argsort(np.frombuffer(keys, dtype=np.uint64), kind="stable")
        del keys
        size = request.shard_size
        total = len(order)
        done = {record["name"]: ShardInfo.model_validate(record) for record in state.done()}
        parts: list[ShardInfo] = []
        fd = os.open(state.listing_path, os.O_RDONLY)
        try:
            with tqdm(
                total=math.ceil(total / size),
                desc=f"parts of {request.manifest_container}",
                unit=" parts",
                disable=not self.progress,
                leave=False,
            ) as bar:
                for number, start in enumerate(range(0, total, size)):
                    info = done.get(part_name(number))
                    if info is None or info.first_index != start:
                        rows = (
                            os.pread(fd, lengths[i], offsets[i]).split(_TAB)
                            for i in order[start : start + size].tolist()
                        )
                        info = self.write_part(number, start, rows, index_of)
                        state.record_done(info.model_dump())
                    parts.append(info)
                    bar.update(1)
                    if self.stop is not None and self.stop("parts", number + 1):
                        raise IndexInterruptedError(
                            f"indexing {self.where} stopped after {number + 1} parts; run it "
                            "again to continue"
                        )
        finally:
            os.close(fd)
        return classes, parts

    def write_part(
        self, number: int, start: int, rows: Iterable[list[bytes]], index_of: dict[bytes, int]
    ) -> ShardInfo:
        entries = [
            PartEntry(
                name=name.decode("utf-8"),
                etag=etag.decode("ascii"),
                bytes=int(size),
                label=index_of[label],
            )
            for name, etag, size, label in rows
        ]
        data = write_part(entries)
        name = part_name(number)
        if self.store.put_if_changed(
            self.request.manifest_container,
            name,
            data,
            PART_CONTENT_TYPE,
            before_upload=self.drop_old_manifest,
        ):
            self.parts_written += 1
        return ShardInfo(
            name=name,
            samples=len(entries),
            bytes=len(data),
            etag=md5_hex(data),
            first_index=start,
            image_bytes=sum(entry.bytes for entry in entries),
        )

    # -- phase 2, webdataset: read each shard once --------------------------------------------

    def webdataset_shards(self) -> tuple[list[str], list[ShardInfo]]:
        state = self.state
        counted = {record["name"]: record for record in state.done()}
        spooled = [line.split(_TAB) for _, line in state.listing()]
        if not spooled:
            raise _refuse(
                f"no WebDataset shards ({', '.join('*' + s for s in _TAR_SUFFIXES)}) under "
                f"{self.where!r}",
                None,
            )
        shards: list[ShardInfo] = []
        labels: set[int] = set()
        first = 0
        with tqdm(
            total=len(spooled),
            desc=f"read shards of {self.where}",
            unit=" shards",
            disable=not self.progress,
            leave=False,
        ) as bar:
            for number, (raw_name, raw_etag, raw_size, _) in enumerate(spooled, start=1):
                name, etag, size = raw_name.decode("utf-8"), raw_etag.decode("ascii"), int(raw_size)
                record = counted.get(name)
                if record is None or record["etag"] != etag:
                    record = self.count_shard(name, etag, size)
                    state.record_done(record)
                labels.update(record["labels"])
                shards.append(
                    ShardInfo(
                        name=name,
                        samples=record["samples"],
                        bytes=size,
                        etag=etag,
                        first_index=first,
                        image_bytes=record["image_bytes"],
                    )
                )
                first += record["samples"]
                bar.update(1)
                if self.stop is not None and self.stop("shards", number):
                    raise IndexInterruptedError(
                        f"indexing {self.where} stopped after reading {number} shards; run it "
                        "again to continue"
                    )
        top = max(labels)
        absent = sorted(set(range(top + 1)) - labels)
        if absent:
            logger.warning(
                "%s: labels 0..%d, but %d of them have no sample (e.g. %s)",
                self.where,
                top,
                len(absent),
                absent[:5],
            )
        return [str(label) for label in range(top + 1)], shards

    def count_shard(self, name: str, etag: str, size: int) -> dict[str, Any]:
        container = self.request.container
        data = self.store.read(container, name)
        if len(data) != size or md5_hex(data) != etag:
            raise _refuse(
                f"{container}/{name} changed while it was being indexed (listed {size} bytes, "
                f"md5 {etag}; read {len(data)} bytes, md5 {md5_hex(data)}): index again",
                name,
            )
        try:
            samples = read_webdataset_shard(
                data,
                f"{container}/{name}",
                label_field=self.request.label_field,
                max_image_bytes=self.request.max_image_bytes,
            )
        except DatasetFormatError as exc:
            raise _refuse(str(exc), name) from exc
        return {
            "name": name,
            "etag": etag,
            "samples": len(samples),
            "image_bytes": sum(len(sample.image_bytes) for sample in samples),
            "labels": sorted({sample.label for sample in samples}),
        }

    # -- phase 3: the manifest ---------------------------------------------------------------

    def write_manifest(
        self, classes: list[str], shards: list[ShardInfo]
    ) -> tuple[DatasetManifest, bool, tuple[str, ...]]:
        request = self.request
        into = request.manifest_container
        try:
            manifest = DatasetManifest.build(
                name=into,
                classes=classes,
                shards=shards,
                shard_size=max(s.samples for s in shards)
                if request.layout is DatasetLayout.WEBDATASET
                else request.shard_size,
                source=f"swift:{request.container}/{request.prefix} ({request.layout} layout, "
                "indexed in place)",
                layout=request.layout,
                data_container=None if request.in_data_container else request.container,
                label_field=request.label_field,
                skipped_objects=self.state.skipped_count,
                skipped_examples=self.state.skipped_examples,
            )
        except InvalidManifestError as exc:
            raise _refuse(f"cannot index {self.where!r}: {exc}", None) from exc
        body = manifest.to_json()
        if len(body) > MAX_MANIFEST_BYTES:
            raise _refuse(
                f"the manifest of {self.where!r} would be {len(body)} bytes, above the limit of "
                f"{MAX_MANIFEST_BYTES}: use larger parts (--shard-size)",
                None,
            )
        written = self.store.put_if_changed(into, MANIFEST_NAME, body, MANIFEST_CONTENT_TYPE)
        return manifest, written, self.delete_stale_parts({s.name for s in shards})

    def delete_stale_parts(self, keep: set[str]) -> tuple[str, ...]:
        into, marker, stale = self.request.manifest_container, "", []
        while True:
            page = self.store.list_page(into, PART_PREFIX, marker, SWIFT_LISTING_LIMIT)
            stale += [e.name for e in page if e.name not in keep]
            if len(page) < SWIFT_LISTING_LIMIT:
                break
            marker = page[-1].name
        for name in stale:
            self.store.delete(into, name)
        return tuple(stale)


def run_index(
    store: IndexStore,
    request: IndexRequest,
    state: IndexState,
    *,
    progress: bool = False,
    stop: StopCheck | None = None,
    page_size: int = SWIFT_LISTING_LIMIT,
) -> IndexResult:
    """Index ``request`` through ``store``, continuing what ``state`` holds; the indexer's core.

    On success ``state`` is cleared. ``stop`` may end the run early (resumably); ``page_size``
    is the listing's page length (Swift's own limit by default).

    Raises:
        DatasetIndexError: bad input, naming the object and the cause (module docstring).
        IndexInterruptedError: ``stop`` said so; run again with the same state to continue.
        DatasetNotFoundError: the data container or the labels object does not exist.
        SwiftError: (a subclass for) another Swift failure, e.g. a container the caller may not
            read (403).
    """
    started = time.perf_counter()
    run = _Run(store, request, state, progress=progress, stop=stop, page_size=page_size)
    run.load_labels()
    run.list_container()
    # After the listing, which writes nothing: a container the caller may not read is refused
    # by the listing itself, before anything is written anywhere.
    run.check_manifest_container()
    if request.layout is DatasetLayout.FOLDER:
        classes, shards = run.folder_parts()
    else:
        classes, shards = run.webdataset_shards()
    manifest, manifest_written, stale = run.write_manifest(classes, shards)
    result = IndexResult(
        manifest=manifest,
        objects_listed=run.listed,
        objects_skipped=state.skipped_count,
        skipped_examples=tuple(state.skipped_examples),
        parts_written=run.parts_written,
        manifest_written=manifest_written,
        stale_deleted=stale,
        resumed=state.resumed,
        seconds=time.perf_counter() - started,
    )
    state.clear()
    logger.info(
        "%s: %d samples, %d classes, %d %s in %.1f s",
        run.where,
        manifest.num_samples,
        manifest.num_classes,
        len(shards),
        "parts" if request.layout is DatasetLayout.FOLDER else "shards",
        result.seconds,
    )
    return result


def sync_index(
    conn: Connection,
    request: IndexRequest,
    *,
    state_dir: Path | None = None,
    progress: bool = True,
    stop: StopCheck | None = None,
    page_size: int = SWIFT_LISTING_LIMIT,
) -> IndexResult:
    """Index ``request`` in Swift as ``conn``'s user, continuing an interrupted run.

    ``state_dir`` holds the run's progress (default: a directory under ``~/.cache/hapi/index``
    named by the request and the account). See :func:`run_index` for the errors.
    """
    if not getattr(conn, "url", None):
        with swift_errors(conn, "authenticate"):
            conn.get_auth()
    fingerprint = request.fingerprint(str(conn.url))
    state = IndexState(state_dir or default_state_dir(fingerprint), fingerprint)
    return run_index(
        SwiftIndexStore(conn), request, state, progress=progress, stop=stop, page_size=page_size
    )


def index_dataset(
    conn: Connection,
    container: str,
    *,
    layout: DatasetLayout | str,
    prefix: str = "",
    labels: str | None = None,
    label_field: str | None = None,
    into: str | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    strict: bool = False,
    state_dir: Path | None = None,
    progress: bool = True,
) -> DatasetManifest:
    """Index the data in ``container`` (under ``prefix``) in place; return its manifest.

    The manifest goes into ``into`` (default: ``container``) as ``manifest.json``, so the
    dataset is then named by that container, like an uploaded one. Objects that are not images
    (folder layout) or shards (webdataset), and hidden ones, are skipped and counted in the
    manifest (``skipped_objects``), or refused if ``strict``. See :func:`sync_index`.
    """
    request = IndexRequest(
        container=container,
        layout=DatasetLayout(layout),
        prefix=prefix,
        labels=labels,
        label_field=label_field,
        into=into,
        shard_size=shard_size,
        strict=strict,
    )
    return sync_index(conn, request, state_dir=state_dir, progress=progress).manifest
