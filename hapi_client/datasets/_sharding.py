"""Cut a source into shards of the dataset format."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hapi_contract.dataset import ShardInfo, md5_hex, sample_key, shard_name, write_shard

from ._source import SourceSample
from .errors import SourceError

__all__ = ["BuiltShard", "iter_shards"]


@dataclass(frozen=True)
class BuiltShard:
    """One shard tar in memory with what the manifest records about it."""

    index: int
    data: bytes
    samples: int
    first_index: int
    image_bytes: int
    etag: str

    @property
    def name(self) -> str:
        """Object name, e.g. ``shards/shard-000000.tar``."""
        return shard_name(self.index)

    def info(self) -> ShardInfo:
        """The manifest entry of this shard."""
        return ShardInfo(
            name=self.name,
            samples=self.samples,
            bytes=len(self.data),
            etag=self.etag,
            first_index=self.first_index,
            image_bytes=self.image_bytes,
        )


def iter_shards(
    samples: Iterable[SourceSample], shard_size: int, *, num_classes: int
) -> Iterator[BuiltShard]:
    """Group ``samples`` into shards of ``shard_size`` (the last may be shorter), keyed by index.

    Raises:
        SourceError: a sample's label is outside ``0..num_classes-1``.
        ShardFormatError: a sample cannot be stored (e.g. bytes that are not JPEG/PNG).
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    iterator = iter(samples)
    first = 0
    for index in itertools.count():
        batch = list(itertools.islice(iterator, shard_size))
        if not batch:
            return
        rows = []
        for offset, (image, ext, label) in enumerate(batch):
            if not 0 <= label < num_classes:
                raise SourceError(
                    f"sample {first + offset}: label {label} outside 0..{num_classes - 1}"
                )
            rows.append((sample_key(first + offset), image, ext, label))
        data = write_shard(rows)
        yield BuiltShard(
            index=index,
            data=data,
            samples=len(batch),
            first_index=first,
            image_bytes=sum(len(sample.image) for sample in batch),
            etag=md5_hex(data),
        )
        first += len(batch)
