"""Memory and time of indexing an ImageNet-sized container in place, on a synthetic listing.

Feeds the in-place indexer's core (``hapi_client.datasets.run_index``) a listing of
``--images`` objects (default 1,281,167, ImageNet-1k's training set) in ``--classes`` class
folders, ``train/<class>/<class>_<n>.JPEG``, served page by page (10,000 names a page, as Swift
does) by an in-memory store that generates each page when asked and discards the part objects
it is given: what is measured is the indexer (listing spool, deal, parts, manifest), not Swift.
With ``--labels`` the classes come from a CSV labels object instead (the name -> class map is
then held in memory: the larger case).

Prints one JSON object: seconds per phase, the peak resident memory of the process
(``ru_maxrss``) and the resident memory before the run (the interpreter and its imports).

    python benchmarks/index_scale.py                  # folder layout, class from the path
    python benchmarks/index_scale.py --labels         # the same images named by a labels CSV
    python benchmarks/index_scale.py --images 50000   # quicker
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hapi_client.datasets import IndexRequest, IndexState, ListingEntry, run_index
from hapi_contract.dataset import DatasetLayout

__all__ = ["SyntheticStore", "main", "measure"]

IMAGENET_TRAIN_IMAGES = 1_281_167
_LABELS = "labels.csv"


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@dataclass
class SyntheticStore:
    """An :class:`~hapi_client.datasets.IndexStore` that lists ``images`` made-up JPEG objects."""

    images: int
    classes: int
    written_bytes: int = 0
    pages: int = 0
    manifests: dict[str, bytes] = field(default_factory=dict)

    def _per_class(self, label: int) -> int:
        base, extra = divmod(self.images, self.classes)
        return base + (label < extra)

    def _names(self, start_class: int, start_index: int) -> Iterator[str]:
        for label in range(start_class, self.classes):
            for index in range(start_index if label == start_class else 0, self._per_class(label)):
                yield f"train/n{label:08d}/n{label:08d}_{index:07d}.JPEG"

    def list_page(self, container: str, prefix: str, marker: str, limit: int) -> list[ListingEntry]:
        if prefix.startswith("hapi-index/"):
            return []
        self.pages += 1
        start = (0, 0)
        if marker:
            label, index = marker.rsplit("/", 1)[1].removesuffix(".JPEG")[1:].split("_")
            start = (int(label), int(index) + 1)
        page: list[ListingEntry] = []
        for name in self._names(*start):
            if len(page) == limit:
                break
            digest = hashlib.md5(name.encode(), usedforsecurity=False)
            page.append(ListingEntry(name, digest.hexdigest(), 60_000 + digest.digest()[0] * 400))
        return page

    def read(self, container: str, name: str) -> bytes:
        return self.manifests[name]

    def read_chunks(self, container: str, name: str) -> Iterator[bytes]:
        lines: list[str] = []
        for name_ in self._names(0, 0):
            lines.append(f"{name_},class-{name_[7:15]}\n")
            if len(lines) == 10_000:
                yield "".join(lines).encode()
                lines.clear()
        yield "".join(lines).encode()

    def exists(self, container: str, name: str) -> bool:
        return name in self.manifests

    def put_if_changed(
        self,
        container: str,
        name: str,
        data: bytes,
        content_type: str,
        before_upload: Callable[[], None] | None = None,
    ) -> bool:
        self.written_bytes += len(data)
        if name == "manifest.json":
            self.manifests[name] = data
        return True

    def delete(self, container: str, name: str) -> None:
        self.manifests.pop(name, None)

    def ensure_container(self, container: str) -> None:
        return None


def measure(images: int, classes: int, *, labels: bool, state_dir: Path) -> dict[str, object]:
    """Index ``images`` synthetic objects; the numbers :func:`main` prints."""
    store = SyntheticStore(images, classes)
    request = IndexRequest(
        "imagenet",
        DatasetLayout.FOLDER,
        prefix="" if labels else "train/",
        labels=_LABELS if labels else None,
        into="imagenet-index",
    )
    phases: dict[str, float] = {}
    last = time.perf_counter()

    def clock(phase: str, count: int) -> bool:
        nonlocal last
        now = time.perf_counter()
        phases[phase] = phases.get(phase, 0.0) + now - last
        last = now
        return False

    rss_before = _rss_mib()
    started = time.perf_counter()
    state = IndexState(state_dir, request.fingerprint("synthetic"))
    result = run_index(store, request, state, stop=clock)
    total = time.perf_counter() - started
    return {
        "images": result.manifest.num_samples,
        "classes": result.manifest.num_classes,
        "parts": len(result.manifest.shards),
        "labels_object": labels,
        "listing_pages": store.pages,
        "seconds_total": round(total, 1),
        "seconds_listing": round(phases.get("listing", 0.0), 1),
        # The deal (hashing and sorting the spooled listing) is counted with the first part.
        "seconds_parts": round(phases.get("parts", 0.0), 1),
        "part_bytes_written": store.written_bytes,
        "manifest_bytes": len(store.manifests["manifest.json"]),
        "rss_before_mib": round(rss_before, 1),
        "peak_rss_mib": round(_peak_rss_mib(), 1),
        "python": platform.python_version(),
        "cpu": _cpu(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=IMAGENET_TRAIN_IMAGES)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--labels", action="store_true", help="classes from a labels CSV")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = measure(args.images, args.classes, labels=args.labels, state_dir=Path(tmp))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
