"""scikit-learn's handwritten digits (1797 images of 8x8, 10 classes) as PNGs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np

from ._source import ImageSource, SourceSample, encode_png
from .errors import SourceError

__all__ = ["DIGITS_CLASSES", "DigitsSource"]

DIGITS_CLASSES: tuple[str, ...] = tuple(str(digit) for digit in range(10))
# load_digits() stores intensities 0..16.
_DIGITS_MAX = 16.0


class DigitsSource(ImageSource):
    """``sklearn.datasets.load_digits`` as 8x8 grayscale PNGs (intensities scaled to 0..255).

    Args:
        split: ``"all"`` (1797 images in sklearn's order), or ``"train"`` / ``"test"``: a seeded
            random split where ``test`` holds ``round(test_fraction * 1797)`` images, both in the
            order of that permutation (classes mixed).
        test_fraction: share of the images in ``test`` (0 < f < 1).
        seed: seed of the split's permutation.
        limit: keep only the first ``limit`` images of the split.
    """

    def __init__(
        self,
        split: Literal["all", "train", "test"] = "all",
        *,
        test_fraction: float = 0.2,
        seed: int = 0,
        limit: int | None = None,
    ) -> None:
        if split not in ("all", "train", "test"):
            raise SourceError(f"digits split must be 'all', 'train' or 'test', not {split!r}")
        if not 0.0 < test_fraction < 1.0:
            raise SourceError(f"test_fraction must be in (0, 1), got {test_fraction}")
        if limit is not None and limit < 1:
            raise SourceError(f"limit must be >= 1, got {limit}")
        from sklearn.datasets import load_digits  # heavy import, only when the source is used

        bunch = load_digits()
        images = np.rint(np.asarray(bunch.images) * (255.0 / _DIGITS_MAX)).astype(np.uint8)
        labels = np.asarray(bunch.target, dtype=np.int64)
        order = np.arange(len(labels))
        if split != "all":
            order = np.random.default_rng(seed).permutation(len(labels))
            n_test = round(test_fraction * len(labels))
            order = order[:n_test] if split == "test" else order[n_test:]
        if limit is not None:
            order = order[:limit]
        self._images = images[order]
        self._labels = labels[order]
        params = [] if split == "all" else [f"test_fraction={test_fraction}", f"seed={seed}"]
        if limit is not None:
            params.append(f"limit={limit}")
        description = f"digits:{split}" + ("?" + "&".join(params) if params else "")
        super().__init__(DIGITS_CLASSES, description)

    def __len__(self) -> int:
        return int(self._labels.shape[0])

    def __iter__(self) -> Iterator[SourceSample]:
        for pixels, label in zip(self._images, self._labels, strict=True):
            yield SourceSample(encode_png(pixels), "png", int(label))
