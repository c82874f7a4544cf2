"""Shard loaders: shard index -> decoded inputs (raw streaming) or split-layer features (HAPI).

A loader returns a shard's samples in stored order; the epoch pipeline permutes and batches them.
With verification on, a HAPI loader recomputes some returned samples locally and fails loudly on
a mismatch, so that a faulty or hostile storage-side server cannot silently poison training.

Every layout of a dataset is read alike (:mod:`hapi_contract.layouts`): the raw loader and the
verifier read a shard with the contract's reader (:func:`hapi_contract.read_shard_samples`, the
one the server runs), a ``folder`` part's images from a pool of threads; a HAPI request names
the shard's layout, so the server reads it the same way.

Every read is pinned to the manifest: a shard is read, here or by the server, only while Swift
reports the etag its manifest recorded (:func:`hapi_contract.check_pin`), so a shard overwritten
after it was indexed or uploaded is refused naming it (here :class:`hapi_contract
.ChangedObjectError`, from the server a 409 ``object_changed``), never trained on silently.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import hapi_models
import torch

from hapi_contract import (
    DEFAULT_COMPRESSION,
    DEFAULT_MAX_SHARD_SAMPLES,
    DEFAULT_OUTPUT_DTYPE,
    Compression,
    DatasetManifest,
    ExtractRequest,
    OutputDtype,
    ProfileSpec,
    ShardSample,
    ShardSource,
    TransformSpec,
    read_shard_samples,
    run_shard_read,
)
from hapi_contract.layouts import DEFAULT_MAX_TAR_BYTES

from .errors import ConfigurationError, VerificationError
from .feature_cache import CachedFeatures, FeatureCache
from .model_store import StoredModel
from .pipeline import LoadedShard, ShardLoader

if TYPE_CHECKING:
    from .swift_session import SwiftSession
    from .transport import HapiTransport

__all__ = [
    "OBJECT_READ_CONCURRENCY",
    "PushdownVerifier",
    "hapi_loader",
    "make_shard_loader",
    "raw_loader",
    "read_source",
]

log = logging.getLogger(__name__)

#: Largest deviation accepted per sample, relative to the sample's largest activation: float32
#: differs only by summation order (thread counts, another device: ~1e-5; TF32 on a GPU server
#: ~1e-3); float16 rounds to 2^-11 and bfloat16 to 2^-8 of each value.
VERIFY_TOLERANCE: dict[OutputDtype, float] = {
    OutputDtype.FLOAT32: 5e-3,
    OutputDtype.FLOAT16: 1e-2,
    OutputDtype.BFLOAT16: 3e-2,
}


#: Image objects of a ``folder`` part the client reads at once (BASELINE, verification).
OBJECT_READ_CONCURRENCY = 16


def read_source(
    swift: SwiftSession,
    source: ShardSource,
    *,
    num_classes: int | None = None,
    observe: bool = True,
    concurrency: int = OBJECT_READ_CONCURRENCY,
) -> tuple[list[ShardSample], int]:
    """A shard's samples in stored order, in its layout, checked as the server checks them
    (the shard object against ``source.etag``, a ``folder`` image against its pin:
    :class:`hapi_contract.ChangedObjectError` when either changed), and the bytes read from
    Swift; ``observe`` feeds the bandwidth estimate.

    Raises:
        hapi_contract.DatasetFormatError: the shard, part or an image is malformed or changed.
        SwiftAccessError: Swift refused a read (a deleted image: 404, named).
    """
    nbytes = 0
    lock = threading.Lock()

    def get(container: str, name: str, max_bytes: int) -> tuple[bytes, str]:
        nonlocal nbytes
        data, etag = swift.get(container, name, observe=observe)
        with lock:
            nbytes += len(data)
        return data, etag

    def get_many(container: str, names: Sequence[str], max_bytes_each: int) -> list[bytes]:
        pool = ThreadPoolExecutor(max(1, min(concurrency, len(names))), "hapi-objects")
        try:
            return list(pool.map(lambda name: get(container, name, max_bytes_each)[0], names))
        finally:
            # After a refusal: the reads not started are not made.
            pool.shutdown(wait=True, cancel_futures=True)

    read = read_shard_samples(
        source,
        num_classes=num_classes,
        max_samples=DEFAULT_MAX_SHARD_SAMPLES,
        max_object_bytes=DEFAULT_MAX_TAR_BYTES,
    )
    samples = run_shard_read(read, get, get_many)
    return samples, nbytes


def raw_loader(
    swift: SwiftSession,
    manifest: DatasetManifest,
    container: str,
    transform: hapi_models.InputTransform,
) -> ShardLoader:
    """BASELINE (and split 0): read the stored shard (a ``folder`` part: its images) and decode
    it locally."""

    def load(k: int) -> LoadedShard:
        source = ShardSource.of(manifest, container, k)
        samples, nbytes = read_source(swift, source, num_classes=manifest.num_classes)
        x = transform.decode_batch(
            [s.image_bytes for s in samples], names=[source.sample_name(s.key) for s in samples]
        )
        y = torch.tensor([s.label for s in samples], dtype=torch.int64)
        return LoadedShard(x, y, nbytes, 1)

    return load


@dataclass
class PushdownVerifier:
    """Recomputes ``samples`` returned samples of a ``fraction`` of the shards locally.

    Which shards and samples are drawn from ``seed``, so the server cannot know which answers
    are checked. A checked shard is downloaded raw (its stored bytes: the cost of checking) and
    the chosen samples run through the local copy of layers ``[0, split)``.
    """

    swift: SwiftSession
    net: hapi_models.SplittableModel
    transform: hapi_models.InputTransform
    fraction: float
    samples: int = 4
    seed: int = 0
    checked_shards: int = 0
    checked_samples: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0 or math.isnan(self.fraction):
            raise ConfigurationError(f"verify fraction must be in [0, 1], got {self.fraction}")
        if self.samples < 1:
            raise ConfigurationError(f"verify samples must be >= 1, got {self.samples}")

    def _draw(self, source: ShardSource, split: int) -> random.Random | None:
        """The generator of a shard's checked samples, or None when the shard is not checked."""
        rng = random.Random(f"{self.seed}/{source.container}/{source.shard}/{split}")
        if self.fraction == 0.0 or rng.random() >= self.fraction:
            return None
        return rng

    def drawn(self, sources: list[ShardSource], split: int) -> int:
        """How many of ``sources`` are checked at ``split`` (the draw is known in advance)."""
        return sum(self._draw(source, split) is not None for source in sources)

    def check(
        self,
        source: ShardSource,
        split: int,
        dtype: OutputDtype,
        loaded: LoadedShard,
    ) -> int:
        """Check ``loaded`` if the shard is drawn; the number of samples verified (0: not drawn).

        A checked shard is read in its layout (a ``folder`` part: its images, each against its
        pin), so the check compares the server's answer with the objects themselves.

        Raises:
            VerificationError: a checked sample differs from the local computation.
        """
        rng = self._draw(source, split)
        if rng is None:
            return 0
        container, shard_name = source.container, source.shard
        stored, _ = read_source(self.swift, source, observe=False)
        picks = sorted(rng.sample(range(len(stored)), min(self.samples, len(stored))))
        labels = torch.tensor([stored[i].label for i in picks], dtype=torch.int64)
        if not torch.equal(loaded.labels[picks].cpu(), labels):
            raise VerificationError(
                f"{container}/{shard_name}: the server's labels differ from the stored ones "
                f"(samples {picks})"
            )
        x = self.transform.decode_batch(
            [stored[i].image_bytes for i in picks],
            names=[source.sample_name(stored[i].key) for i in picks],
        )
        device = next(self.net.parameters()).device
        with torch.inference_mode():
            expected = self.net.head(split)(x.to(device)).float().cpu()
        got = loaded.inputs[picks].float().cpu()
        tolerance = VERIFY_TOLERANCE[dtype]
        for j, i in enumerate(picks):
            scale = float(expected[j].abs().max()) or 1.0
            worst = float((got[j] - expected[j]).abs().max())
            if not worst <= tolerance * scale:  # `not <=` also catches NaN
                raise VerificationError(
                    f"{container}/{shard_name} sample {i}: the server's split-{split} features "
                    f"differ from the local computation by {worst:.3g} (largest activation "
                    f"{scale:.3g}; {dtype.value} allows {tolerance:g} of it). The storage-side "
                    "server is faulty or not to be trusted"
                )
        self.checked_shards += 1
        self.checked_samples += len(picks)
        log.info("verified %d samples of %s/%s", len(picks), container, shard_name)
        return len(picks)


def hapi_loader(
    transport: HapiTransport,
    manifest: DatasetManifest,
    container: str,
    stored: StoredModel,
    split: int,
    transform: hapi_models.InputTransform,
    profile_spec: ProfileSpec | None,
    b_max: int,
    dtype: OutputDtype,
    compression: Compression,
    cache: FeatureCache | None,
    verifier: PushdownVerifier | None = None,
) -> ShardLoader:
    """HAPI: the server runs layers ``[0, split)`` next to Swift and returns the features."""
    spec = TransformSpec.model_validate(transform)
    transform_key = spec.model_dump_json()

    def load(k: int) -> LoadedShard:
        info = manifest.shards[k]
        source = ShardSource.of(manifest, container, k)
        key = FeatureCache.key(info.etag, stored.sha256, split, transform_key, dtype.value)
        if cache is not None:
            hit = cache.get(key)
            if hit is not None:
                return LoadedShard(hit.features, hit.labels, 0, 0)
        req = ExtractRequest(
            **source.request_fields(),
            model=stored.ref(),
            split_index=split,
            transform=spec,
            b_max=b_max,
            profile=profile_spec,
            output_dtype=dtype,
            compression=compression,
        )
        got = transport.extract(req, num_samples=info.samples)
        feats = got.features if got.features.dtype == torch.float32 else got.features.float()
        loaded = LoadedShard(feats, got.labels, got.wire_bytes, got.attempts)
        if verifier is not None:
            verified = verifier.check(source, split, dtype, loaded)
            if verified:
                loaded = dataclasses.replace(loaded, verified_samples=verified)
        if cache is not None:  # only what passed verification is kept
            cache.put(key, CachedFeatures(feats, got.labels))
        return loaded

    return load


def make_shard_loader(
    swift: SwiftSession,
    transport: HapiTransport,
    manifest: DatasetManifest,
    container: str,
    *,
    split: int,
    transform: hapi_models.InputTransform,
    stored: StoredModel | None = None,
    profile_spec: ProfileSpec | None = None,
    b_max: int = 1000,
    output_dtype: OutputDtype = DEFAULT_OUTPUT_DTYPE,
    compression: Compression = DEFAULT_COMPRESSION,
    cache: FeatureCache | None = None,
    verifier: PushdownVerifier | None = None,
) -> ShardLoader:
    """Split 0 (or no ``stored`` model): raw shards decoded locally from ``swift``; else HAPI
    features through ``transport``."""
    if split == 0 or stored is None:
        return raw_loader(swift, manifest, container, transform)
    return hapi_loader(
        transport,
        manifest,
        container,
        stored,
        split,
        transform,
        profile_spec,
        b_max,
        output_dtype,
        compression,
        cache,
        verifier,
    )
