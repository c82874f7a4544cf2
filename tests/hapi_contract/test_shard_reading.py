"""``read_shard_samples`` with ``first``: a timing request's read of a ``folder`` part GETs only
the images it times, not the hundreds its part lists (no Swift: the reads are answered here)."""

from __future__ import annotations

from collections.abc import Sequence

from hapi_contract import DatasetLayout, ShardSource, read_shard_samples
from hapi_contract.dataset import md5_hex
from hapi_contract.layouts import PartEntry, write_part
from hapi_contract.shard_reading import run_shard_read

IMAGES = {f"train/c/{i:03d}.jpg": b"\xff\xd8\xff" + bytes([i]) * 20 for i in range(50)}
PART = write_part(
    PartEntry(name=name, etag=md5_hex(data), bytes=len(data), label=0)
    for name, data in IMAGES.items()
)
SOURCE = ShardSource("index", "hapi-index/part-000000.jsonl", DatasetLayout.FOLDER, "data")


def _read(first: int | None) -> tuple[list[str], list[str]]:
    asked: list[str] = []

    def get(container: str, name: str, max_bytes: int) -> tuple[bytes, str]:
        return PART, md5_hex(PART)

    def get_many(container: str, names: Sequence[str], max_bytes: int) -> list[bytes]:
        asked.extend(names)
        return [IMAGES[n] for n in names]

    read = read_shard_samples(
        SOURCE, num_classes=1, max_samples=100, max_object_bytes=1 << 20, first=first
    )
    samples = run_shard_read(read, get, get_many)
    return [s.key for s in samples], asked


def test_a_folder_parts_first_images_are_the_only_ones_read() -> None:
    keys, asked = _read(first=16)
    assert keys == asked == list(IMAGES)[:16]


def test_without_first_every_image_is_read() -> None:
    keys, asked = _read(first=None)
    assert keys == asked == list(IMAGES)
