"""One extraction from request to frames, the same for every host (see :mod:`hapi_core.flow`).

Everything that can be refused with a status code (access, missing objects, sha256, shard
format, limits, memory) is checked in :func:`prepare`, before a response starts; a failure
after that (e.g. an image whose body is corrupt past its header) ends the stream with an error
frame (:func:`~hapi_core.answers.stream_error`). :func:`prepare` runs in cost order: cheap
checks, the meta-device profile, the weights' HEAD, the shard's HEAD, the memory plan (the
shard's bytes, the weights' download and load, the samples at their COS batch), and only then,
inside the admitted memory, the shard's read and the model's load.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from hapi_contract import (
    ChangedObjectError,
    DatasetFormatError,
    DatasetLayout,
    ExtractRequest,
    FinetuneRequest,
    ImageData,
    ModelRef,
    Parse,
    ReadObject,
    ReadObjects,
    ShardRead,
    ShardSource,
    TimingsRequest,
    TooManySamplesError,
    read_shard_samples,
)
from hapi_contract.frames import FrameEncoder
from hapi_contract.layouts import (
    DEFAULT_MAX_TAR_BYTES,
    GZIP_TRAILER_BYTES,
    PartEntry,
    gzip_trailer_size,
)
from hapi_contract.shard_reading import check_pin

from .adaptation import DeviceScheduler, Reservation, make_demand, new_request_id
from .admission import admit_model, build_model, check_weights, input_transform
from .engine import ExtractionJob, JobStats
from .errors import (
    InvalidShardError,
    NotFoundError,
    ObjectChangedError,
    PayloadTooLargeError,
)
from .estimates import model_footprint
from .flow import Await, Compute, Flow, Get, GetMany, Head, ObjectInfo, Reserve, StoredObject
from .inputs import check_named_images
from .runtime import CoreRuntime
from .shared_features import (
    Computation,
    Joined,
    RecordingEncoder,
    SharedFeatures,
    feature_key,
    reframe,
)
from .solver import Demand, effective_b_min
from .weights_cache import CachedModel, CacheKey

__all__ = [
    "ModelPlan",
    "PreparedExtraction",
    "SharedExtraction",
    "abandon",
    "conclude",
    "finish",
    "job_of",
    "load_planned",
    "pin_if_resident",
    "plan_weights",
    "prepare",
    "prepare_extraction",
    "read_named_samples",
    "read_samples",
    "release_model",
    "reserve_and_load",
    "source_of",
]

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass
class ModelPlan:
    """The weights a request needs, authorised and sized, before any of them is loaded."""

    ref: ModelRef
    key: CacheKey
    info: ObjectInfo
    load_bytes: int
    """Memory the planner must admit to load the model (0: the cache already holds it): its
    resident bytes and the downloaded blob it is built from."""
    entry: CachedModel | None = None
    """The cached model, pinned for this request (released by :func:`release_model`)."""
    blob_bytes: int = 0
    """The downloaded blob's part of ``load_bytes``: freed once the model is built."""

    def overlap_blob(self, sample_bytes: int) -> None:
        """The blob is freed before the request's first COS batch of ``sample_bytes`` is
        decoded, so the two share memory: plan only the blob's excess over them."""
        if self.load_bytes:
            shared = min(self.blob_bytes, max(0, sample_bytes))
            self.load_bytes -= shared
            self.blob_bytes -= shared


def plan_model(
    rt: CoreRuntime, ref: ModelRef, info: ObjectInfo, scheduler: DeviceScheduler
) -> ModelPlan:
    """Size the load of ``ref``'s weights, whose HEAD as the caller answered ``info``.

    A cached model is only handed to a caller who may read the weights object (the HEAD
    authorised it), and only while that object is still the blob that was verified (its etag).
    """
    w = ref.weights
    assert w is not None  # admit_model ran first
    key: CacheKey = (w.sha256, ref.arch, ref.num_classes, scheduler.device.name)
    entry = rt.weights.lookup(key)
    if entry is not None and entry.etag == info.etag:
        rt.weights.acquire(entry)
        return ModelPlan(ref, key, info, 0, entry)
    check_weights(ref, info.size, rt.settings.max_weights_bytes)
    # The memory the model will hold and the downloaded blob it is built from, both planned
    # before the download: the blob is freed (handed back) once the model is loaded.
    blob = info.size if info.size is not None else rt.settings.max_weights_bytes
    footprint = model_footprint(ref.arch, ref.num_classes)
    folded = footprint.folded_bytes if rt.settings.fold_batch_norms else 0
    load_bytes = footprint.resident_bytes + folded + blob
    return ModelPlan(ref, key, info, load_bytes, blob_bytes=blob)


def plan_weights(rt: CoreRuntime, ref: ModelRef, scheduler: DeviceScheduler) -> Flow[ModelPlan]:
    """Authorise the weights as the caller and size their load; nothing is read or built.

    Cheap checks come first (the model's weight bytes against ``max_weights_bytes``, then the
    object's size from a HEAD against the model's), so weights of another model, or a class
    count whose classifier alone is gigabytes, are refused in milliseconds.
    """
    w = ref.weights
    assert w is not None  # admit_model ran first
    check_weights(ref, None, rt.settings.max_weights_bytes)
    info: ObjectInfo = yield Head(w.container, w.object)
    return plan_model(rt, ref, info, scheduler)


def source_of(req: ExtractRequest | FinetuneRequest, shard: str) -> ShardSource:
    """Where ``shard`` of a request lies (its container, layout, data container, label field)
    and the etag the request pins it to, if any (a 409 when Swift's differs)."""
    etag = req.etag if isinstance(req, ExtractRequest) else req.etags.get(shard)
    return ShardSource(
        req.container, shard, req.layout, req.data_container, req.label_field, etag=etag
    )


ReserveRead = Callable[[int, int | None], Flow[None]]
"""Plans ``nbytes`` of stored objects before they are read, holding at most ``samples`` samples
(None: not known before the read) (a :class:`Reserve` of the request)."""


def read_samples(
    rt: CoreRuntime,
    source: ShardSource,
    num_classes: int,
    reserve: ReserveRead | None = None,
) -> Flow[tuple[list[ImageData], list[int]]]:
    """:func:`read_named_samples` without the names."""
    images, labels, _ = yield from read_named_samples(rt, source, num_classes, reserve)
    return images, labels


def read_named_samples(
    rt: CoreRuntime,
    source: ShardSource,
    num_classes: int,
    reserve: ReserveRead | None = None,
    read_etags: list[str] | None = None,
    first: int | None = None,
) -> Flow[tuple[list[ImageData], list[int], list[str]]]:
    """A shard's images and labels in any layout, read as the caller and checked: the format
    (422), the sample count (413), the shard object and a folder part's images against their
    pins (409) and every image's header (413 / 422); each error names the object. The names
    come back with the samples (:meth:`ShardSource.sample_name`), for the decode's errors.

    The reading itself is the contract's (:func:`hapi_contract.read_shard_samples`, which the
    client's BASELINE mode runs too); this flow performs its reads and parsing as effects.

    ``reserve`` is called once, with the bytes the read will hold and the most samples they
    can hold, before they are read: a shard object's size from a HEAD as the caller (a tar
    member takes at least 512 bytes and a sample two: at most one sample per KiB); for a
    ``folder`` part, the part's bytes and the sizes it pins for its images, and their count
    (the part itself, a list of names, is read first). A read it was not called before (a
    reader of another shape) calls it with what was read. ``read_etags`` collects the etag
    Swift answered each object GET with (the shard, or a folder part).
    """
    settings = rt.settings
    read = read_shard_samples(
        source,
        num_classes=num_classes,
        max_samples=settings.max_samples_per_request,
        max_object_bytes=settings.max_object_bytes,
        max_image_bytes=settings.max_image_bytes,
        first=first,
    )
    try:
        samples = yield from _perform_read(rt, read, source, reserve, read_etags)
    except ChangedObjectError as exc:
        raise ObjectChangedError(str(exc)) from exc
    except TooManySamplesError as exc:
        raise PayloadTooLargeError(str(exc)) from exc
    except DatasetFormatError as exc:
        raise InvalidShardError(str(exc)) from exc
    images = [s.image_bytes for s in samples]
    names = [source.sample_name(s.key) for s in samples]
    yield Compute(functools.partial(check_named_images, images, names, settings.max_image_pixels))
    return images, [s.label for s in samples], names


def _perform_read(
    rt: CoreRuntime,
    read: ShardRead[T],
    source: ShardSource,
    reserve: ReserveRead | None,
    read_etags: list[str] | None = None,
) -> Flow[T]:
    """Run a contract read with this core's effects (see :mod:`hapi_contract.shard_reading`),
    planning its bytes through ``reserve`` before the bulk of them is read."""
    answer: Any = None
    held = 0  # bytes read so far (a folder part)
    declared = 0  # image bytes a folder part pins
    while True:
        try:
            step = read.send(answer)
        except StopIteration as stop:
            if reserve is not None:
                yield from reserve(held, None)
            return stop.value  # type: ignore[no-any-return]
        match step:
            case ReadObject(container, name, max_bytes):
                if reserve is not None and source.layout is not DatasetLayout.FOLDER:
                    # The shard is the request's bulk: its size (the HEAD authorises the read
                    # too) is planned before any of it is read.
                    info: ObjectInfo = yield Head(container, name)
                    size = min(max_bytes, info.size or max_bytes)
                    stored = info.size or 0
                    if source.layout is DatasetLayout.WEBDATASET and stored >= GZIP_TRAILER_BYTES:
                        # A .tar.gz's tar, decompressed beside it: the size its trailer states
                        # (what the reader then holds it to; 0 for a plain tar). Not for an
                        # object too short to hold one: Swift answers its range 416.
                        trailer: StoredObject = yield Get(
                            container, name, GZIP_TRAILER_BYTES, tail=GZIP_TRAILER_BYTES
                        )
                        size += min(DEFAULT_MAX_TAR_BYTES, gzip_trailer_size(trailer.data))
                    yield from reserve(size, size // 1024 + 1)
                    reserve = None
                blob: StoredObject = yield Get(container, name, max_bytes)
                held += len(blob.data)
                if read_etags is not None:
                    read_etags.append(blob.etag)
                answer = (blob.data, blob.etag)  # the reader checks a pinned shard's etag
            case ReadObjects(container, names, max_bytes_each):
                if reserve is not None:
                    images = declared or len(names) * max_bytes_each
                    yield from reserve(held + images, len(names))
                    reserve = None
                concurrency = rt.settings.object_read_concurrency
                try:
                    blobs: list[StoredObject] = yield GetMany(
                        container, names, max_bytes_each, concurrency
                    )
                except NotFoundError as exc:
                    raise ObjectChangedError(
                        f"{exc.detail}: deleted after the dataset was indexed (index it again)"
                    ) from exc
                answer = [b.data for b in blobs]
            case Parse(work):
                answer = yield Compute(work)
                if isinstance(answer, list) and answer and isinstance(answer[0], PartEntry):
                    declared = sum(entry.bytes for entry in answer)
        del step


def load_planned(
    rt: CoreRuntime, plan: ModelPlan, scheduler: DeviceScheduler, reservation: Reservation
) -> Flow[CachedModel]:
    """The planned model on the scheduler's device, loaded within the admitted reservation."""
    if plan.entry is not None:
        return plan.entry
    ref, w = plan.ref, plan.ref.weights
    assert w is not None  # admit_model ran first
    entry = rt.weights.lookup(plan.key)
    if entry is None or entry.etag != plan.info.etag:
        blob: StoredObject = yield Get(w.container, w.object, rt.settings.max_weights_bytes)
        build = functools.partial(build_model, ref, blob.data, scheduler.device.torch_device)
        model = yield Compute(build)
        # Another request may have loaded the same blob meanwhile: keep one copy, the cached.
        entry = rt.weights.lookup(plan.key)
        if entry is None or entry.etag != blob.etag:
            folded = model_footprint(ref.arch, ref.num_classes).folded_bytes
            extra = folded if rt.settings.fold_batch_norms else 0
            entry = rt.weights.insert(plan.key, model, blob.etag, extra)
    rt.weights.acquire(entry)
    plan.entry = entry
    # The model is resident now (the cache counts it) and the load's copies are gone.
    scheduler.hand_over_model_bytes(reservation, plan.load_bytes)
    plan.blob_bytes = 0
    return entry


def _reserve(
    rt: CoreRuntime, plan: ModelPlan, scheduler: DeviceScheduler, demand: Demand
) -> Flow[Reservation]:
    """Wait for memory for ``demand`` (its model's load planned by ``plan``)."""
    pinned = plan.entry.nbytes if plan.entry is not None else 0
    refresh = functools.partial(pin_if_resident, rt, plan)
    reservation: Reservation = yield Reserve(scheduler, demand, pinned, refresh)
    return reservation


def reserve_and_load(
    rt: CoreRuntime, plan: ModelPlan, scheduler: DeviceScheduler, demand: Demand
) -> Flow[tuple[Reservation, CachedModel]]:
    """Wait for memory for ``demand``, then load the planned model within it. On a failure the
    reservation is released; the plan's pinned model stays the caller's to release."""
    reservation = yield from _reserve(rt, plan, scheduler, demand)
    try:
        entry = yield from load_planned(rt, plan, scheduler, reservation)
    except BaseException:
        scheduler.release(reservation)
        raise
    return reservation, entry


def pin_if_resident(rt: CoreRuntime, plan: ModelPlan, demand: Demand) -> Demand:
    """``demand`` less the model's load once the cache holds the planned model (another
    request loaded it meanwhile), which is then pinned for this request; for a waiting request,
    before each planning round (see :meth:`DeviceScheduler.submit`)."""
    if plan.entry is not None or plan.load_bytes == 0:
        return demand
    entry = rt.weights.lookup(plan.key)
    if entry is None or entry.etag != plan.info.etag:
        return demand
    rt.weights.acquire(entry)
    load, plan.entry, plan.load_bytes = plan.load_bytes, entry, 0
    return dataclasses.replace(demand, model_bytes=max(0, demand.model_bytes - load))


def release_model(rt: CoreRuntime, plan: ModelPlan) -> None:
    """Unpin the plan's model, if it holds one (after an error before the request ran)."""
    if plan.entry is not None:
        rt.weights.release(plan.entry)
        plan.entry = None


@dataclass
class PreparedExtraction:
    request: ExtractRequest
    request_id: str
    scheduler: DeviceScheduler
    reservation: Reservation
    model: CachedModel
    images: list[ImageData]
    labels: list[int]
    started: float
    queued_s: float
    read_s: float = 0.0
    """Reading and checking the samples (the shard, or a part and its images)."""
    names: list[str] | None = None
    """Where each image came from, for the decode's errors (:meth:`ShardSource.sample_name`)."""
    stream_started: bool = False
    finished: bool = False
    computation: Computation | None = None
    """The shared computation this request leads (see :mod:`hapi_core.shared_features`)."""
    encoder: RecordingEncoder | None = None
    """The leading job's encoder, which keeps its features for the others."""
    owner: str = ""
    """The caller's account, whose requests share its turns at a CPU's cores
    (:class:`~hapi_core.forward_turns.ForwardTurns`)."""

    def settle_shared(self, rt: CoreRuntime, succeeded: bool) -> None:
        """Hand a leading job's features to the requests waiting for them and to the store
        (nothing when the job failed or stopped early); idempotent."""
        if self.computation is not None:
            result = self.encoder.collected() if succeeded and self.encoder else None
            rt.features.settle(self.computation, result)
            self.computation = None


@dataclass
class SharedExtraction:
    """A request answered with features computed once for many (see
    :mod:`hapi_core.shared_features`): from the store (``how`` = ``"hit"``) or from another
    request's computation it joined (``"coalesced"``). It holds no reservation and no model:
    the features are the store's, and re-framing them is all that is left."""

    request: ExtractRequest
    request_id: str
    device: str
    features: SharedFeatures
    how: str
    started: float
    waited_s: float = 0.0
    finished: bool = False

    @property
    def batch_size(self) -> int:
        """The request's own COS batch: its ``b_max``, within the server's sample limit."""
        return max(1, min(self.request.b_max, self.features.count))

    def frames(self) -> tuple[FrameEncoder, Iterator[bytes]]:
        """The request's encoder and its batch frames, re-framed at :attr:`batch_size`."""
        req = self.request
        encoder = FrameEncoder(dtype=req.output_dtype, compression=req.compression)
        return encoder, reframe(encoder, self.features, self.batch_size)

    def end_meta(self, encoder: FrameEncoder, encode_s: float) -> dict[str, object]:
        """The end frame's meta, shaped as a computed request's (nothing decoded or run)."""
        sizes = [
            min(self.batch_size, self.features.count - start)
            for start in range(0, self.features.count, self.batch_size)
        ]
        return {
            "cos_batch_sizes": sizes,
            "server_ms": {
                "total": round((time.perf_counter() - self.started) * 1000, 3),
                "queued": round(self.waited_s * 1000, 3),
                "decode": 0.0,
                "compute": 0.0,
                "encode": round(encode_s * 1000, 3),
                "read": 0.0,
            },
            "feature_bytes": encoder.payload_bytes,
            "vmhwm_resets": 0,
            "request_id": self.request_id,
            "device": self.device,
            "split_index": self.request.split_index,
            "shared": self.how,
        }


def _share(
    rt: CoreRuntime,
    req: ExtractRequest,
    namespace: str,
    plan: ModelPlan,
    request_id: str,
    device: str,
    started: float,
) -> Flow[SharedExtraction | Computation | None]:
    """Features of ``req`` computed once for many: stored ones, a computation to wait for, or
    one this request leads (None: nothing to share, e.g. a ``folder`` part, whose images are
    many objects). The shard's HEAD as the caller comes first, so a caller Swift refuses gets
    the same 401/403/404 whether or not another caller's job computed the features, and the
    key holds the etag Swift answered this caller now: an overwritten shard is a new key."""
    store = rt.features
    if not store.enabled or req.layout is DatasetLayout.FOLDER:
        return None
    info: ObjectInfo = yield Head(req.container, req.shard)
    try:
        check_pin(source_of(req, req.shard), info.etag)
    except ChangedObjectError as exc:
        raise ObjectChangedError(str(exc)) from exc
    key = feature_key(namespace, req, info.etag, plan.info.etag)
    found = store.begin(key)
    if isinstance(found, Joined):
        waiting = time.perf_counter()
        timeout = rt.settings.request_timeout_s - (waiting - started)
        result: SharedFeatures | None = yield Await(found.computation, max(0.0, timeout))
        if result is None:
            return None  # the computation failed or was given up: compute alone
        return SharedExtraction(
            req, request_id, device, result, "coalesced", started, time.perf_counter() - waiting
        )
    if isinstance(found, SharedFeatures):
        return SharedExtraction(req, request_id, device, found, "hit", started)
    return found


def prepare(rt: CoreRuntime, req: ExtractRequest) -> Flow[PreparedExtraction]:
    """Everything refusable with a status, in cost order: cheap checks, reads, admission, load."""
    prep = yield from _prepare(rt, req, None)
    assert isinstance(prep, PreparedExtraction)
    return prep


def prepare_extraction(
    rt: CoreRuntime, req: ExtractRequest, namespace: str
) -> Flow[PreparedExtraction | SharedExtraction]:
    """:func:`prepare`, sharing features between requests when the runtime has a feature
    store: the caller's own HEADs of the weights and the shard authorise it first;
    ``namespace`` names the caller's account (object paths are per account). A
    :class:`PreparedExtraction` that leads a computation carries it
    (:attr:`PreparedExtraction.computation`); its host settles it when the job ends."""
    return (yield from _prepare(rt, req, namespace))


def _prepare(
    rt: CoreRuntime, req: ExtractRequest, namespace: str | None
) -> Flow[PreparedExtraction | SharedExtraction]:
    started = time.perf_counter()
    settings = rt.settings
    spec = admit_model(req.model, req.split_index)
    request_id = req.request_id or new_request_id()
    transform = input_transform(req.transform)
    scheduler = rt.pick_scheduler()
    if req.profile is not None and req.profile.num_layers != spec.num_layers:
        log.warning(
            "%s: client profile has %d layers, %s has %d",
            request_id,
            req.profile.num_layers,
            req.model.arch,
            spec.num_layers,
        )
    # A meta-device profile: milliseconds, and a 422 for a crop the network cannot take.
    est = yield Compute(
        functools.partial(
            rt.estimator.estimate,
            req.model.arch,
            req.model.num_classes,
            transform.input_shape,
            req.split_index,
            scheduler.device.torch_device.type,
        )
    )
    plan = yield from plan_weights(rt, req.model, scheduler)
    computation: Computation | None = None
    if namespace is not None:
        try:
            shared = yield from _share(
                rt, req, namespace, plan, request_id, scheduler.device.name, started
            )
        except BaseException:
            release_model(rt, plan)
            raise
        if isinstance(shared, SharedExtraction):
            release_model(rt, plan)
            return shared
        computation = shared
    held: list[Reservation] = []
    queued = [0.0, 0.0]  # when the request queued, how long it waited

    def reserve_read(nbytes: int, samples: int | None) -> Flow[None]:
        # Every byte of the request planned before the first of them is read: the shard's
        # (nbytes), the weights' download and load, and its samples at the planned COS batch.
        b_max = min(req.b_max, settings.max_samples_per_request, samples or req.b_max)
        b_min = effective_b_min(settings.b_min, b_max)
        plan.overlap_blob(b_min * est.bytes_per_sample)
        demand = make_demand(
            request_id,
            est.bytes_per_sample,
            plan.load_bytes,  # 0 when the weights are resident (counted by the cache)
            settings.b_min,
            b_max,
            input_bytes=nbytes,
        )
        queued[0] = time.perf_counter()
        held.append((yield from _reserve(rt, plan, scheduler, demand)))
        queued[1] = time.perf_counter() - queued[0]

    read_etags: list[str] = []
    try:
        reading = time.perf_counter()
        images, labels, names = yield from read_named_samples(
            rt,
            source_of(req, req.shard),
            req.model.num_classes,
            reserve_read,
            read_etags,
            # A timing request times its first images only: a folder part's others (hundreds
            # of GETs) would cost a warm plan seconds for nothing.
            first=req.samples if isinstance(req, TimingsRequest) else None,
        )
        if computation is not None and read_etags != [computation.key.shard_etag]:
            # The shard was overwritten between this request's HEAD and its GET: its features
            # are not those of the key the others wait for.
            rt.features.settle(computation, None)
            computation = None
        read_s = time.perf_counter() - reading - queued[1]
        reservation = held[0]
        # The shard's count is known now: a COS batch larger than it would hold memory idle.
        scheduler.shrink(reservation, len(images))
        entry = yield from load_planned(rt, plan, scheduler, reservation)
    except BaseException:
        for r in held:
            scheduler.release(r)
        release_model(rt, plan)
        if computation is not None:
            rt.features.settle(computation, None)
        raise
    return PreparedExtraction(
        request=req,
        request_id=request_id,
        scheduler=scheduler,
        reservation=reservation,
        model=entry,
        images=images,
        labels=labels,
        started=started,
        queued_s=queued[1],
        read_s=read_s,
        names=names,
        computation=computation,
        owner=namespace or "",
    )


def finish(rt: CoreRuntime, prep: PreparedExtraction, status: str) -> None:
    """Release the request's memory and weights and count it; idempotent, never blocks."""
    if prep.finished:
        return
    prep.finished = True
    prep.settle_shared(rt, succeeded=False)  # no-op once the job settled it
    # The images go with the reservation: the planning round that the release starts measures
    # the process's memory on a CPU, where images still held count as occupied outside the
    # plan (issue 27: the request queued behind a 988 MB folder part was refused 507). Cleared
    # in place: the job shares the list, and a decode thread may still hold the job.
    prep.images.clear()
    prep.scheduler.release(prep.reservation)
    rt.weights.release(prep.model)
    elapsed = time.perf_counter() - prep.started
    rt.metrics.request_seconds.labels("extract", status).observe(elapsed)
    rt.metrics.requests.labels("extract", status).inc()


def abandon(rt: CoreRuntime, prep: PreparedExtraction) -> None:
    """The response ended before its stream started (the client left while the request was
    queued, say): nothing else will release the reservation, so release it now."""
    if not prep.stream_started:
        finish(rt, prep, "499")


def job_of(rt: CoreRuntime, prep: PreparedExtraction) -> ExtractionJob:
    """The compute of a prepared request: its head over its images at the planned COS batch."""
    prep.stream_started = True
    req = prep.request
    encoder = FrameEncoder(dtype=req.output_dtype, compression=req.compression)
    if prep.computation is not None:
        prep.encoder = RecordingEncoder(
            count=len(prep.images),
            dtype=req.output_dtype,
            compression=req.compression,
            computation=prep.computation,
        )
        encoder = prep.encoder
    return ExtractionJob(
        model=prep.model.model,
        split=req.split_index,
        images=prep.images,
        labels=prep.labels,
        transform=input_transform(req.transform),
        batch_size=prep.reservation.batch_size,
        device=prep.scheduler.device,
        max_pixels=rt.settings.max_image_pixels,
        encoder=encoder,
        names=prep.names,
        request_id=prep.request_id,
        owner=prep.owner,
        arrived=prep.started,
        **rt.engine_options(),
    )


def conclude(
    rt: CoreRuntime, prep: PreparedExtraction, job: ExtractionJob, stats: JobStats
) -> dict[str, object]:
    """Learn from a finished job (the estimator's measured peak, the metrics) and return the
    end frame's meta."""
    req = prep.request
    if stats.peak_bytes_per_sample is not None:
        rt.estimator.observe(
            req.model.arch,
            req.model.num_classes,
            job.transform.input_shape,
            req.split_index,
            job.device.torch_device.type,
            stats.peak_bytes_per_sample,
        )
        rt.metrics.measured_peak_bytes.labels(job.device.name).set(
            stats.peak_bytes_per_sample * job.batch_size
        )
    rt.metrics.samples.labels("extract").inc(len(prep.images))
    rt.metrics.extract_computations.inc()
    rt.metrics.extract_compute_seconds.inc(stats.decode_s + stats.compute_s + stats.encode_s)
    meta = stats.as_meta(time.perf_counter() - prep.started, prep.queued_s)
    server_ms = meta["server_ms"]
    assert isinstance(server_ms, dict)
    server_ms["read"] = round(prep.read_s * 1000, 3)
    meta.update(request_id=prep.request_id, device=job.device.name, split_index=req.split_index)
    return meta
