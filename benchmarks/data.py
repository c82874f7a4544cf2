"""Datasets and models in the testbed's Swift, uploaded once and reused by later runs.

A dataset whose manifest already records the same source (photos are generated from a seed, so
the source description fixes every byte) and shard size is reused without regenerating a single
image; anything else goes through :func:`hapi_client.datasets.sync_dataset`, which sends only
the shards that differ. Models go through :func:`hapi_client.upload_model` (unchanged weights
are not sent again).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from swiftclient.client import Connection

from hapi_client import StoredModel, upload_model
from hapi_client.datasets import DatasetError, get_source, load_manifest, sync_dataset
from hapi_contract import DatasetManifest

if TYPE_CHECKING:
    from .testbed import Testbed

__all__ = ["MODELS_CONTAINER", "DatasetReady", "ensure_dataset", "ensure_models", "photos_spec"]

log = logging.getLogger(__name__)

MODELS_CONTAINER = "bench-models"


def photos_spec(split: str, per_class: int, size: str = "500x375") -> str:
    """The source spec of ImageNet-sized photos (about 112 KB per JPEG at 500x375)."""
    return f"photos:{split}?per_class={per_class}&size={size}"


@dataclass(frozen=True)
class DatasetReady:
    container: str
    manifest: DatasetManifest
    reused: bool
    seconds: float

    def describe(self) -> str:
        m = self.manifest
        how = "reused" if self.reused else f"uploaded in {self.seconds:.0f} s"
        return (
            f"{self.container}: {m.num_samples} images in {len(m.shards)} shards of {m.shard_size}, "
            f"{m.mean_shard_bytes_per_sample / 1e3:.0f} KB stored per image ({how})"
        )


def ensure_dataset(
    conn: Connection, spec: str, container: str, shard_size: int, *, progress: bool = True
) -> DatasetReady:
    """The dataset ``spec`` in ``container``: reused when its manifest matches, else synced."""
    started = time.perf_counter()
    source = get_source(spec)
    try:
        manifest = load_manifest(conn, container)
    except DatasetError:
        manifest = None
    if (
        manifest is not None
        and manifest.source == source.description
        and manifest.shard_size == shard_size
        and manifest.num_samples == len(source)
    ):
        return DatasetReady(container, manifest, True, time.perf_counter() - started)
    result = sync_dataset(conn, source, container, shard_size=shard_size, progress=progress)
    return DatasetReady(container, result.manifest, False, time.perf_counter() - started)


def ensure_models(conn: Connection, archs: list[str]) -> dict[str, StoredModel]:
    """Upload each architecture's weights (packaged ImageNet weights, else a seeded random init)."""
    stored = {}
    for arch in archs:
        stored[arch], uploaded = upload_model(conn, arch, container=MODELS_CONTAINER)
        log.info("model %s %s", stored[arch].name, "uploaded" if uploaded else "already stored")
    return stored


def ensure_photos_and_models(
    testbed: Testbed, per_class: int, container: str, shard_size: int, archs: list[str]
) -> tuple[DatasetReady, dict[str, StoredModel]]:
    """The training photos and the models' weights in the testbed's Swift, over an unshaped link
    (the set-up every scenario on photos shares)."""
    testbed.set_rate(None)
    conn = testbed.connection()
    try:
        data = ensure_dataset(conn, photos_spec("train", per_class), container, shard_size)
        return data, ensure_models(conn, archs)
    finally:
        conn.close()
