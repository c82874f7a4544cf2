"""The feature cache on local disk: a restarted worker finds the features it had already fetched.

:class:`DiskFeatureCache` keeps the in-memory LRU of :class:`~hapi_client.FeatureCache` in front
of a directory of safetensors files, one per key (the shard's etag, the weights' sha256, the
split, the transform and the wire dtype: the memory cache's key). The directory may be shared by
every process of a node (the ranks of a torchrun job, a restarted job):

- a file appears whole or not at all (written to a temporary name in the same directory,
  fsynced, then :func:`os.replace`d), so a reader never sees half a file, and two processes
  writing the same key write the same bytes;
- each file carries its key and a sha256 of its tensors in its header, so a truncated or
  corrupted file (or a hash collision of the name) is detected, deleted and fetched again;
- the directory is held under ``max_bytes``: a hit touches the file's mtime and the least
  recently used files go first; one process evicts at a time (a :mod:`filelock` lock), the
  others skip eviction rather than wait.

The disk is a cache: a file that cannot be written (disk full, read-only) is logged and the run
goes on with the features in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_tensors

from .checkpoint_store import atomic_write
from .errors import ConfigurationError
from .feature_cache import CachedFeatures, CacheKey, FeatureCache

__all__ = ["DiskFeatureCache"]

log = logging.getLogger(__name__)

_SUFFIX = ".safetensors"
_TMP = ".tmp-"
#: A temporary file older than this was left by a killed writer.
_STALE_TMP_S = 3600.0
_KEY_FIELD = "hapi_feature_key"
_DIGEST_FIELD = "hapi_feature_sha256"


def _key_json(key: CacheKey) -> str:
    return json.dumps(list(key), separators=(",", ":"))


def _digest(features: torch.Tensor, labels: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in (features, labels):
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class DiskFeatureCache(FeatureCache):
    """A :class:`~hapi_client.FeatureCache` backed by safetensors files in ``directory``.

    ``max_bytes`` caps the directory (the files' sizes); ``memory_bytes`` the in-memory LRU in
    front of it. ``hits`` and ``misses`` count lookups answered by memory or disk and those that
    were not; ``disk_hits`` those the disk answered, ``corrupt`` the files found damaged,
    ``too_large`` the entries not written because each alone exceeds ``max_bytes``.
    """

    def __init__(
        self, directory: str | Path, *, max_bytes: int = 20 * 2**30, memory_bytes: int = 4 * 2**30
    ) -> None:
        super().__init__(memory_bytes)
        if max_bytes < 1:
            raise ConfigurationError(
                f"the disk feature cache needs max_bytes >= 1, got {max_bytes}"
            )
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot use {self.directory} for the feature cache: {exc}"
            ) from exc
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise ConfigurationError(
                f"the feature cache directory {self.directory} is not writable"
            )
        self.disk_max_bytes = max_bytes
        self.disk_hits = 0
        self.corrupt = 0
        self.too_large = 0
        self._evict_lock = FileLock(str(self.directory / ".evict.lock"))

    def path_for(self, key: CacheKey) -> Path:
        """The file that holds ``key``'s features (named by a hash: the key holds any text)."""
        name = hashlib.sha256(_key_json(key).encode()).hexdigest()
        return self.directory / f"{name}{_SUFFIX}"

    def get(self, key: CacheKey) -> CachedFeatures | None:
        in_memory = self._memory_get(key)
        if in_memory is not None:
            return in_memory
        entry = self._read(key)
        with self._lock:
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self.disk_hits += 1
        super().put(key, entry)
        return entry

    def _memory_get(self, key: CacheKey) -> CachedFeatures | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            return entry

    def put(self, key: CacheKey, entry: CachedFeatures) -> None:
        super().put(key, entry)
        try:
            self._write(key, entry)
        except OSError as exc:
            log.warning("feature cache: could not write %s: %s", self.path_for(key), exc)
            return
        self._evict()

    def clear(self) -> None:
        """Empty memory and disk (every process's files in the directory)."""
        super().clear()
        for path in self.directory.glob(f"*{_SUFFIX}"):
            path.unlink(missing_ok=True)

    @property
    def disk_bytes(self) -> int:
        return sum(size for _, size, _ in self._files())

    def _read(self, key: CacheKey) -> CachedFeatures | None:
        path = self.path_for(key)
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                features = f.get_tensor("features")
                labels = f.get_tensor("labels")
        except FileNotFoundError:
            return None
        except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as exc:
            self._discard(path, f"unreadable ({exc})")
            return None
        if meta.get(_KEY_FIELD) != _key_json(key):
            self._discard(path, "holds another key")
            return None
        if meta.get(_DIGEST_FIELD) != _digest(features, labels):
            self._discard(path, "its tensors do not match their sha256")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the recency the eviction goes by
        return CachedFeatures(features, labels)

    def _discard(self, path: Path, why: str) -> None:
        log.warning("feature cache: %s %s; fetching it again", path.name, why)
        with self._lock:
            self.corrupt += 1
        path.unlink(missing_ok=True)

    def _write(self, key: CacheKey, entry: CachedFeatures) -> None:
        path = self.path_for(key)
        if path.exists():
            return  # another rank wrote it: the same key holds the same features
        features = entry.features.detach().cpu().contiguous()
        labels = entry.labels.detach().cpu().contiguous()
        data = save_tensors(
            {"features": features, "labels": labels},
            metadata={_KEY_FIELD: _key_json(key), _DIGEST_FIELD: _digest(features, labels)},
        )
        if len(data) > self.disk_max_bytes:
            with self._lock:
                self.too_large += 1
                first = self.too_large == 1
            if first:  # once: every shard of a run is about the same size
                log.warning(
                    "feature cache: a shard's features take %d bytes, above the disk cap of %d "
                    "bytes (max_bytes, --feature-cache-gb): they are kept in memory only, and "
                    "so are the next ones that do not fit",
                    len(data),
                    self.disk_max_bytes,
                )
            return
        atomic_write(path, data, prefix=_TMP, suffix=_SUFFIX)

    def _files(self, *, temporary: bool = False) -> list[tuple[float, int, Path]]:
        out = []
        for path in self.directory.glob(f"*{_SUFFIX}"):
            if path.name.startswith(_TMP) != temporary:
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # evicted or renamed by another process meanwhile
            out.append((st.st_mtime, st.st_size, path))
        return out

    def _evict(self) -> None:
        try:
            self._evict_lock.acquire(timeout=0)
        except Timeout:
            return  # another process is evicting; it holds the directory under the cap
        try:
            now = time.time()
            for mtime, _, path in self._files(temporary=True):
                if now - mtime > _STALE_TMP_S:
                    path.unlink(missing_ok=True)
            files = sorted(self._files())
            total = sum(size for _, size, _ in files)
            for _, size, path in files:
                if total <= self.disk_max_bytes:
                    break
                path.unlink(missing_ok=True)
                total -= size
        finally:
            self._evict_lock.release()
