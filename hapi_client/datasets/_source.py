"""The interface every sample source implements."""

from __future__ import annotations

import abc
import io
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
from PIL import Image

__all__ = ["ImageSource", "SourceSample"]


class SourceSample(NamedTuple):
    """One labelled, encoded image: ``image`` bytes, ``ext`` ("jpg"|"png"), integer ``label``."""

    image: bytes
    ext: str
    label: int


class ImageSource(abc.ABC):
    """A finite, ordered, deterministic sequence of labelled encoded images.

    Iterating twice yields the same bytes in the same order, which is what makes re-uploading a
    dataset a no-op. ``label`` indexes ``classes``; ``description`` is recorded in the manifest.
    """

    def __init__(self, classes: Sequence[str], description: str) -> None:
        self.classes: tuple[str, ...] = tuple(classes)
        self.description = description

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of samples the iterator yields."""

    @abc.abstractmethod
    def __iter__(self) -> Iterator[SourceSample]:
        """Yield the samples in order."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description!r}: {len(self)} samples>"


def encode_png(pixels: np.ndarray) -> bytes:
    """Lossless PNG of a uint8 grayscale (H, W) or RGB (H, W, 3) array."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()
