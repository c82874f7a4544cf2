"""Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (idx files, gzip)."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np

from ._source import ImageSource, SourceSample, encode_png
from .errors import SourceError

__all__ = ["FASHION_MNIST_CLASSES", "FASHION_MNIST_DIR", "FashionMNISTSource"]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FILE_PREFIX = {"train": "train", "test": "t10k"}
_UBYTE = 0x08


def _read_idx_header(handle: gzip.GzipFile, path: Path, ndim: int) -> tuple[int, ...]:
    """Dimensions from an idx header: 2 zero bytes, dtype code, ndim, then ndim big-endian u32."""
    head = handle.read(4)
    if len(head) != 4 or head[:2] != b"\0\0" or head[2] != _UBYTE or head[3] != ndim:
        raise SourceError(f"{path}: not an idx file of unsigned bytes with {ndim} dimensions")
    raw = handle.read(4 * ndim)
    if len(raw) != 4 * ndim:
        raise SourceError(f"{path}: truncated idx header")
    return struct.unpack(f">{ndim}I", raw)


def _read_idx(path: Path, ndim: int, count: int | None) -> np.ndarray:
    """The first ``count`` items (all if None) of an idx ubyte file as a uint8 array."""
    try:
        with gzip.open(path, "rb") as handle:
            dims = _read_idx_header(handle, path, ndim)
            n = dims[0] if count is None else min(count, dims[0])
            item = int(np.prod(dims[1:], dtype=np.int64))
            raw = handle.read(n * item)
    except (OSError, EOFError) as exc:
        raise SourceError(
            f"cannot read {path}: {exc} (install the Debian package dataset-fashion-mnist)"
        ) from exc
    if len(raw) != n * item:
        raise SourceError(f"{path}: truncated idx data ({len(raw)} of {n * item} bytes)")
    return np.frombuffer(raw, dtype=np.uint8).reshape((n, *dims[1:]))


class FashionMNISTSource(ImageSource):
    """Fashion-MNIST (28x28 grayscale, 10 classes) as PNGs, in the files' order.

    Args:
        split: ``"train"`` (60 000 images) or ``"test"`` (10 000).
        limit: keep only the first ``limit`` images.
        root: folder holding ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``.
    """

    def __init__(
        self,
        split: Literal["train", "test"] = "train",
        *,
        limit: int | None = None,
        root: Path | str = FASHION_MNIST_DIR,
    ) -> None:
        if split not in _FILE_PREFIX:
            raise SourceError(f"fashion-mnist split must be 'train' or 'test', not {split!r}")
        if limit is not None and limit < 1:
            raise SourceError(f"limit must be >= 1, got {limit}")
        root = Path(root)
        prefix = _FILE_PREFIX[split]
        self._images_path = root / f"{prefix}-images-idx3-ubyte.gz"
        self._labels = _read_idx(root / f"{prefix}-labels-idx1-ubyte.gz", 1, limit)
        if self._labels.size and int(self._labels.max()) >= len(FASHION_MNIST_CLASSES):
            raise SourceError(f"{root}: label {int(self._labels.max())} out of range 0..9")
        description = f"fashion-mnist:{split}" + (f"?limit={limit}" if limit is not None else "")
        super().__init__(FASHION_MNIST_CLASSES, description)
        self._limit = limit

    def __len__(self) -> int:
        return int(self._labels.shape[0])

    def __iter__(self) -> Iterator[SourceSample]:
        images = _read_idx(self._images_path, 3, len(self))
        if images.shape[0] != len(self):
            raise SourceError(
                f"{self._images_path}: {images.shape[0]} images but {len(self)} labels"
            )
        for pixels, label in zip(images, self._labels, strict=True):
            yield SourceSample(encode_png(pixels), "png", int(label))
