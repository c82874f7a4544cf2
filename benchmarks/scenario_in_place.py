"""``inplace``: the same images as one uploaded shard vs as single objects indexed in place.

One ``/v1/extract`` request over each, through the real HAPI server next to Swift: the shard is
one GET; the folder part is a GET of the part and then one GET per image as the caller, at most
``object_read_concurrency`` at once (issue 23: the thesis' storage requests, one per object).
Per layout the server's own clock (the end frame's ``server_ms``) gives the images per second,
the storage read time (the part and its images, or the shard, with their checks) and the
decode + compute time. Then two requests at once over each layout, as a client's prefetch
sends them: while one request computes, the other's reads proceed, so the server is not idle
waiting for reads when its compute is the bound.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hapi_client import HapiClient, StoredModel
from hapi_client.datasets import get_source, index_dataset
from hapi_contract import DatasetLayout, DatasetManifest, ExtractRequest, ShardSource, TransformSpec
from hapi_core.settings import CoreSettings

from .data import ensure_dataset, ensure_models, photos_spec
from .results import ResultSet
from .testbed import Testbed

__all__ = ["run_in_place"]

log = logging.getLogger(__name__)

ARCH, SPLIT = "resnet18", 7
SHARD_CONTAINER = "bench-inplace-shard"
OBJECTS_CONTAINER = "bench-inplace-objects"
INDEX_CONTAINER = "bench-inplace-index"
TRANSFORM = TransformSpec(
    resize=256, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
)
#: One shard (and one part) holds every image.
ONE_SHARD = 10_000
GOAL = 0.8


def _put_objects(testbed: Testbed, spec: str) -> DatasetManifest:
    """The photos one object per image (``train/<class>/NNNN.jpg``), indexed in place."""
    conn = testbed.connection()
    try:
        conn.put_container(OBJECTS_CONTAINER)
        source = get_source(spec)
        for index, (image, ext, label) in enumerate(source):
            conn.put_object(
                OBJECTS_CONTAINER, f"train/{source.classes[label]}/{index:05d}.{ext}", image
            )
        with tempfile.TemporaryDirectory() as state:
            return index_dataset(
                conn,
                OBJECTS_CONTAINER,
                layout="folder",
                prefix="train",
                into=INDEX_CONTAINER,
                shard_size=ONE_SHARD,
                state_dir=Path(state),
                progress=False,
            )
    finally:
        conn.close()


def _request(stored: StoredModel, source: ShardSource) -> ExtractRequest:
    return ExtractRequest(
        **source.request_fields(),
        model=stored.ref(),
        split_index=SPLIT,
        transform=TRANSFORM,
        b_max=50,
    )


def _server_ms(client: HapiClient, req: ExtractRequest, samples: int) -> dict[str, float]:
    got = client.transport.extract(req, num_samples=samples)
    server_ms: dict[str, float] = dict(got.end.meta["server_ms"])
    return server_ms


def _pipelined(client: HapiClient, req: ExtractRequest, samples: int) -> float:
    """Images per second of two requests at once (client wall clock)."""
    began = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(client.transport.extract, req, samples) for _ in range(2)]:
            future.result()
    return 2 * samples / (time.perf_counter() - began)


def run_in_place(testbed: Testbed, out_dir: str, quick: bool = True) -> int:
    """The ``inplace`` scenario; writes ``inplace.json`` and ``inplace.csv``."""
    per_class, repeats = (10, 3) if quick else (50, 5)
    spec = photos_spec("train", per_class)
    concurrency = CoreSettings().object_read_concurrency
    results = ResultSet.start(
        "inplace",
        testbed=testbed.describe(),
        quick=quick,
        arch=ARCH,
        split=SPLIT,
        object_read_concurrency=concurrency,
        goal_ratio=GOAL,
    )
    testbed.start_stack()
    testbed.set_rate(None)
    conn = testbed.connection()
    try:
        shard = ensure_dataset(conn, spec, SHARD_CONTAINER, ONE_SHARD, progress=False).manifest
        stored = ensure_models(conn, [ARCH])[ARCH]
    finally:
        conn.close()
    folder = _put_objects(testbed, spec)
    assert len(shard.shards) == len(folder.shards) == 1
    n = shard.num_samples
    requests = {
        DatasetLayout.SHARDS: _request(stored, ShardSource.of(shard, SHARD_CONTAINER, 0)),
        DatasetLayout.FOLDER: _request(stored, ShardSource.of(folder, INDEX_CONTAINER, 0)),
    }
    with testbed.client() as client:
        for req in requests.values():  # loads the weights; warms Swift's and the OS's caches
            _server_ms(client, req, n)
        runs: dict[DatasetLayout, list[dict[str, float]]] = {layout: [] for layout in requests}
        for _ in range(repeats):  # interleaved, so drift in the machine's load hits both
            for layout, req in requests.items():
                runs[layout].append(_server_ms(client, req, n))
        pipelined = {layout: _pipelined(client, req, n) for layout, req in requests.items()}
    rows: dict[DatasetLayout, dict[str, Any]] = {}
    for layout, measured in runs.items():
        total = statistics.median(m["total"] for m in measured) / 1e3
        row = {
            "layout": layout.value,
            "images": n,
            "requests": len(measured),
            "server_s": total,
            "server_images_per_s": n / total,
            "read_s": statistics.median(m["read"] for m in measured) / 1e3,
            "decode_compute_s": statistics.median(m["decode"] + m["compute"] for m in measured)
            / 1e3,
            "concurrency": concurrency if layout is DatasetLayout.FOLDER else 1,
            "pipelined_images_per_s": pipelined[layout],
            "stored_mb": (
                folder.total_bytes if layout is DatasetLayout.FOLDER else shard.total_bytes
            )
            / 1e6,
        }
        rows[layout] = row
        results.add(row)
        print(
            f"[inplace] {layout.value:7s}: {row['server_images_per_s']:6.1f} images/s on the "
            f"server (read {row['read_s']:.3f} s, decode+compute {row['decode_compute_s']:.2f} s"
            f", {row['concurrency']} read(s) at once); two at once "
            f"{row['pipelined_images_per_s']:.1f} images/s",
            flush=True,
        )
    ratio = (
        rows[DatasetLayout.FOLDER]["server_images_per_s"]
        / rows[DatasetLayout.SHARDS]["server_images_per_s"]
    )
    results.meta["ratio"] = ratio
    results.meta["pipelined_ratio"] = (
        rows[DatasetLayout.FOLDER]["pipelined_images_per_s"]
        / rows[DatasetLayout.SHARDS]["pipelined_images_per_s"]
    )
    print(f"[inplace] in place / shard: {ratio:.2f}x images/s (goal >= {GOAL})", flush=True)
    testbed.stop_stack()
    paths = results.write(Path(out_dir))
    print("[inplace] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0
