"""One extraction for many jobs: the server's store of computed features and its coalescing.

Concurrent fine-tunes of one backbone (a sweep, seeds, several teams) ask for the same features:
the same shard object, weights, split, transform and wire dtype. The first request of a
:class:`FeatureKey` computes (it *leads* a :class:`Computation`); a request for the same key
arriving meanwhile *joins* it and waits (bounded by its request timeout) for the whole result;
a later one finds the result in the :class:`FeatureStore`. Every request then receives the
samples re-framed at its own COS batch size (:func:`reframe`), in shard order.

What is shared never bypasses Swift's access control: the key holds the shard and weights
objects' paths in the caller's account and their etags *as this request's own HEAD, as the
caller, answered them* (see :func:`hapi_core.extraction.prepare_extraction`), so a caller Swift
refuses gets the refusal before the store is consulted, and an overwritten object (a new etag)
is a new key, computed again. A leader whose GET of the shard answered another etag than its
HEAD publishes nothing.

The store holds each entry whole (per-sample features at the wire dtype and the labels): the
sample order and the framing are the requester's, never the computing request's. It is bounded
in bytes and evicts the least recently used entry; with a directory, entries are safetensors
files (no pickle) in this process's own subdirectory of it, so that processes sharing the
directory (proxy workers, a restarted server beside a running one) each bound their own, and a
store starting removes those of processes that have ended (:mod:`hapi_core.store_directory`).
A directory that cannot be written (removed, full, read-only) turns the store off, said once in
the log; a request never fails because of the store.

Neither the store nor a computation's copy is in the per-request memory plan, so both are
bounded by the same figure: the copies that computations in flight record (:class:`Recording`)
hold at most ``capacity_bytes`` together, and a computation whose copy would pass that stops
recording (its waiters then compute their own). The memory outside the plan that sharing can
hold is thus at most twice the store's bound.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hapi_contract import ExtractRequest, OutputDtype
from hapi_contract.frames import FrameEncoder

from .errors import RequestTimeoutError
from .metrics import Metrics
from .store_directory import OwnedDirectory, claim, remove_ended

__all__ = [
    "Computation",
    "FeatureKey",
    "FeatureStore",
    "Joined",
    "Recording",
    "RecordingEncoder",
    "SharedFeatures",
    "feature_key",
    "reframe",
]

log = logging.getLogger(__name__)

_TORCH_DTYPES = {
    OutputDtype.FLOAT32: torch.float32,
    OutputDtype.FLOAT16: torch.float16,
    OutputDtype.BFLOAT16: torch.bfloat16,
}


@dataclass(frozen=True)
class FeatureKey:
    """What makes two requests' features the same bytes. Compression is not part of it: the
    stored features are re-encoded (and compressed) for each request anyway."""

    shard: str
    """The shard object's path in the caller's account (``account/container/object``)."""
    shard_etag: str
    layout: str
    label_field: str | None
    num_classes: int
    weights: str
    weights_etag: str
    sha256: str
    arch: str
    split: int
    transform: str
    """The request's transform as canonical JSON (sorted keys)."""
    dtype: str

    def digest(self) -> str:
        """A file name for the key (sha256 of its canonical JSON)."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def feature_key(
    namespace: str, req: ExtractRequest, shard_etag: str, weights_etag: str
) -> FeatureKey:
    """The key of ``req``'s features; ``namespace`` names the caller's account, the etags are
    those the caller's own HEADs answered."""
    weights = req.model.weights
    assert weights is not None  # admit_model ran first
    transform = json.dumps(req.transform.model_dump(mode="json"), sort_keys=True)
    return FeatureKey(
        shard=f"{namespace}/{req.container}/{req.shard}",
        shard_etag=shard_etag,
        layout=req.layout.value,
        label_field=req.label_field,
        num_classes=req.model.num_classes,
        weights=f"{namespace}/{weights.container}/{weights.object}",
        weights_etag=weights_etag,
        sha256=weights.sha256,
        arch=req.model.arch,
        split=req.split_index,
        transform=transform,
        dtype=OutputDtype(req.output_dtype).value,
    )


@dataclass(frozen=True)
class SharedFeatures:
    """One shard's features at the wire dtype (``features[i]`` is sample ``i``) and labels."""

    features: torch.Tensor
    labels: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.labels.shape[0])

    @property
    def nbytes(self) -> int:
        return self.features.numel() * self.features.element_size() + self.labels.numel() * 8


@dataclass
class Recording:
    """The bytes that computations in flight may copy for the others, at most ``capacity``
    together (the store's bound): the copies are outside the per-request plan too."""

    capacity: int
    used: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > self.capacity:
                return False
            self.used += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.used = max(0, self.used - nbytes)


class RecordingEncoder(FrameEncoder):
    """A :class:`FrameEncoder` that keeps a copy of every batch at the wire dtype, so the
    leading request's job fills the store without a change to the engine. The copy is charged
    to ``computation`` (:meth:`Computation.record`); once refused, recording stops for good
    and :meth:`collected` is None."""

    def __init__(
        self,
        *,
        count: int,
        dtype: OutputDtype,
        computation: Computation | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(dtype=dtype, **kwargs)  # type: ignore[arg-type]
        self._count = count
        self._computation = computation
        self._parts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.recording = True

    def batch(
        self,
        features: torch.Tensor,
        labels: torch.Tensor,
        offset: int,
        meta: dict[str, object] | None = None,
    ) -> bytes:
        frame = super().batch(features, labels, offset, meta)
        if not self.recording:
            return frame
        dtype = _TORCH_DTYPES[self.dtype]
        nbytes = features.numel() * dtype.itemsize + labels.numel() * 8
        if self._computation is not None and not self._computation.record(nbytes):
            # Over the bound: the frames go on, the copy goes (the waiters compute their own).
            self.recording = False
            self._parts.clear()
            return frame
        wire = features.detach().to("cpu", dtype=dtype).contiguous()
        self._parts[offset] = (wire, labels.detach().to("cpu", dtype=torch.int64))
        return frame

    def collected(self) -> SharedFeatures | None:
        """Every sample recorded, in shard order; None unless each was recorded exactly once."""
        if not self.recording:
            return None
        parts = [self._parts[k] for k in sorted(self._parts)]
        expected = 0
        for offset, (features, _) in zip(sorted(self._parts), parts, strict=True):
            if offset != expected:
                return None
            expected += features.shape[0]
        if expected != self._count or not parts:
            return None
        return SharedFeatures(
            torch.cat([p[0] for p in parts]).contiguous(), torch.cat([p[1] for p in parts])
        )


def reframe(encoder: FrameEncoder, shared: SharedFeatures, batch_size: int) -> Iterator[bytes]:
    """``shared`` as this request's frames: COS batches of ``batch_size``, in shard order."""
    meta = {"cos_batch_size": batch_size}
    for start in range(0, shared.count, batch_size):
        stop = min(shared.count, start + batch_size)
        yield encoder.batch(
            shared.features[start:stop], shared.labels[start:stop], offset=start, meta=meta
        )


@dataclass(eq=False)
class Computation:
    """The features of one key being computed by one request for every request that joined.

    It belongs to the group: the computing request stops only once neither it (its client
    left) nor any joined request still wants the result (:attr:`cancelled`). Settled once,
    with the features or None (failed, cancelled, or the object changed under the read).
    """

    key: FeatureKey
    budget: Recording | None = None
    """What the leading job's copy of the features is charged to (None: unbounded)."""
    recorded_bytes: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)
    waiters: int = 0
    owner_gone: bool = False
    settled: bool = False
    result: SharedFeatures | None = None
    _callbacks: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, nbytes: int) -> bool:
        """Charge ``nbytes`` more of the leading job's copy; False (nothing charged) past the
        budget or once settled."""
        with self._lock:
            if self.settled or (self.budget is not None and not self.budget.take(nbytes)):
                return False
            self.recorded_bytes += nbytes
            return True

    def owner_left(self) -> None:
        """The computing request's client left: stop unless someone else waits."""
        with self._lock:
            self.owner_gone = True
            if self.waiters == 0:
                self.cancelled.set()

    def on_settled(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (from the settling thread) once settled; the returned function
        gives up waiting (this request no longer wants the result)."""
        with self._lock:
            self.waiters += 1
            settled = self.settled
            if not settled:
                self._callbacks.append(callback)
        if settled:
            callback()

        def leave() -> None:
            with self._lock:
                self.waiters -= 1
                if callback in self._callbacks:
                    self._callbacks.remove(callback)
                if self.waiters == 0 and self.owner_gone and not self.settled:
                    self.cancelled.set()

        return leave

    def outcome(self) -> SharedFeatures | None:
        return self.result

    def timed_out(self) -> BaseException:
        return RequestTimeoutError(
            f"timed out waiting for the features of {self.key.shard} that another request "
            "is computing (request_timeout)"
        )

    def settle(self, result: SharedFeatures | None) -> bool:
        """Hand ``result`` to every waiter; False when it was settled already."""
        with self._lock:
            if self.settled:
                return False
            self.settled, self.result = True, result
            callbacks, self._callbacks = self._callbacks, []
            recorded, self.recorded_bytes = self.recorded_bytes, 0
        if self.budget is not None:
            self.budget.give(recorded)  # the copy is the store's now, or garbage
        for callback in callbacks:
            callback()
        return True


@dataclass(frozen=True)
class Joined:
    """A computation of the key that another request leads: wait for it."""

    computation: Computation


@dataclass
class _Entry:
    nbytes: int
    features: SharedFeatures | None = None
    """In memory; None when the entry is a file in the store's directory."""


class FeatureStore:
    """Computed features by :class:`FeatureKey`, at most ``capacity_bytes``, least recently
    used evicted first; in memory, or as files in this process's subdirectory of ``directory``
    (:func:`~hapi_core.store_directory.claim`), where those of ended processes are removed when
    the store starts. Capacity 0: off (neither stored nor coalesced)."""

    def __init__(
        self, capacity_bytes: int, directory: str | Path | None, metrics: Metrics | None
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.directory = Path(directory) if directory is not None else None
        self._metrics = metrics
        self._entries: OrderedDict[FeatureKey, _Entry] = OrderedDict()
        self._computing: dict[FeatureKey, Computation] = {}
        self._lock = threading.Lock()
        self.bytes = 0
        self.recording = Recording(capacity_bytes)
        self.enabled = capacity_bytes > 0
        self._owned: OwnedDirectory | None = None
        if self.enabled and self.directory is not None:
            try:
                self._owned = claim(self.directory)
                ended = remove_ended(self.directory)
            except OSError as exc:
                self._give_up(exc)
            else:
                if ended:
                    log.info(
                        "feature store %s: removed the entries of %d ended process(es)",
                        self.directory,
                        len(ended),
                    )

    def _count(self, what: str, amount: float = 1) -> None:
        if self._metrics is not None:
            getattr(self._metrics, f"feature_store_{what}").inc(amount)

    def _give_up(self, exc: Exception) -> None:
        """The directory failed: no store from now on (said once; requests go on computing)."""
        if self.enabled:
            self.enabled = False
            log.warning(
                "feature store %s cannot be written (%s): running without a feature store",
                self.directory,
                exc,
            )
        self._entries.clear()
        self.bytes = 0
        self._gauge()

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.feature_store_bytes.set(self.bytes)

    def begin(self, key: FeatureKey) -> SharedFeatures | Joined | Computation | None:
        """Stored features (a hit), a computation to join (coalesced), or one this caller
        leads and must :meth:`settle` (a miss); None when the store is off. The caller's
        access was checked before."""
        if not self.enabled:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            else:
                found = self._lead_or_join(key)
        if entry is None:
            return self._counted(found)
        shared = entry.features if entry.features is not None else self._load(key)
        if shared is not None:
            self._count("hits")
            return shared
        with self._lock:
            found = self._lead_or_join(key)
        return self._counted(found)

    def _lead_or_join(self, key: FeatureKey) -> Joined | Computation:
        """Under the lock: the computation of ``key`` in flight, or a new one this caller leads.
        Looking and registering under one hold: two requests arriving together must not both
        miss and compute (the second would also hide the first from later requests)."""
        running = self._computing.get(key)
        if running is not None and not running.cancelled.is_set():
            return Joined(running)
        computation = Computation(key, self.recording)
        self._computing[key] = computation
        return computation

    def _counted(self, found: Joined | Computation) -> Joined | Computation:
        self._count("coalesced" if isinstance(found, Joined) else "misses")
        return found

    def settle(self, computation: Computation, result: SharedFeatures | None) -> None:
        """End ``computation`` with ``result`` (None: nothing to share), store it if it fits
        and wake its waiters."""
        if result is not None and computation.settle(result):
            # Stored before it stops being joinable: a request arriving meanwhile joins the
            # settled computation (and gets its result at once) or hits, never computes again.
            self.put(computation.key, result)
            self._forget(computation)
        else:
            self._forget(computation)
            computation.settle(None)

    def _forget(self, computation: Computation) -> None:
        with self._lock:
            if self._computing.get(computation.key) is computation:
                del self._computing[computation.key]

    def put(self, key: FeatureKey, shared: SharedFeatures) -> None:
        """Keep ``shared`` under ``key`` if it fits, evicting the least recently used."""
        nbytes = shared.nbytes
        if not self.enabled or nbytes > self.capacity_bytes:
            return
        entry = _Entry(nbytes, shared)
        if self._owned is not None:
            try:
                self._write(key, shared)
            except Exception as exc:  # noqa: BLE001 - safetensors' own errors too (disk full)
                self._give_up(exc)
                return
            entry.features = None
        with self._lock:
            old = self._entries.pop(key, None)
            self.bytes += nbytes - (old.nbytes if old is not None else 0)
            self._entries[key] = entry
            evicted = []
            while self.bytes > self.capacity_bytes and self._entries:
                victim, gone = self._entries.popitem(last=False)
                self.bytes -= gone.nbytes
                evicted.append(victim)
        for victim in evicted:
            self._count("evictions")
            self._remove(victim)
        self._count("stored_bytes", nbytes)
        self._gauge()

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def _path(self, key: FeatureKey) -> Path:
        assert self._owned is not None
        return self._owned.path / f"{key.digest()}.safetensors"

    def _write(self, key: FeatureKey, shared: SharedFeatures) -> None:
        assert self._owned is not None
        # Written whole, then renamed: a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=self._owned.path, suffix=".part")
        os.close(fd)
        try:
            save_file(
                {"features": shared.features, "labels": shared.labels},
                tmp,
                metadata={"key": json.dumps(asdict(key), sort_keys=True)},
            )
            os.replace(tmp, self._path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _load(self, key: FeatureKey) -> SharedFeatures | None:
        try:
            tensors = load_file(self._path(key))
            return SharedFeatures(tensors["features"], tensors["labels"])
        except Exception as exc:  # noqa: BLE001 - any unreadable file is a miss
            # A file removed or damaged under us: a miss, and the entry is dropped.
            log.warning("feature store entry %s unreadable (%s): computing it", key.shard, exc)
            with self._lock:
                gone = self._entries.pop(key, None)
                if gone is not None:
                    self.bytes -= gone.nbytes
            self._gauge()
            return None

    def _remove(self, key: FeatureKey) -> None:
        if self._owned is not None:
            try:
                self._path(key).unlink(missing_ok=True)
            except OSError as exc:
                log.debug("could not remove evicted feature file: %s", exc)
