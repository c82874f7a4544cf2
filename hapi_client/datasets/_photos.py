"""ImageNet-sized JPEGs cut from the real photos that scikit-learn and scikit-image ship.

Each class is one photo; each sample is a random view of it: a random crop (35-100 % of the
largest box of the output's aspect ratio that fits, aspect jittered by +-10 %), a horizontal flip
half of the time, a rotation of up to +-10 degrees, colour changes (saturation 0.7-1.3, contrast
0.8-1.2, brightness +-20 levels, per-channel gain 0.9-1.1) and a light sensor-like grain
(Gaussian, sigma 4 levels). It is rendered at ``size`` (default 500x375, a typical ImageNet
photo) with 2x2 supersampling and saved as a baseline JPEG (4:2:0). The default quality (97) is
tuned so the mean stored size is near the ~110 KB of an ImageNet JPEG (measured: 112 KB over
1000 images); the grain is what makes these smooth, resampled views cost as many bytes as a real
photo does.

Sample ``i`` shows photo ``i % len(classes)`` and is drawn from its own random generator seeded
by ``(seed, split, i)``: the output depends on nothing else (not on ``workers``), and ``train``
and ``test`` never share a view.
"""

from __future__ import annotations

import io
import itertools
import math
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from functools import cache
from typing import Literal

import numpy as np
from PIL import Image, ImageChops

from ._source import ImageSource, SourceSample
from .errors import SourceError

__all__ = [
    "PHOTO_CLASSES",
    "PHOTO_DEFAULT_QUALITY",
    "PHOTO_DEFAULT_SIZE",
    "PhotoSource",
    "load_photo",
]

# The colour photos bundled inside the wheels (no download): sklearn's two sample images and
# scikit-image's data files. `cat` is the same file as `chelsea`; grayscale ones are left out.
PHOTO_CLASSES: tuple[str, ...] = (
    "china",
    "flower",
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "motorcycle",
)
PHOTO_DEFAULT_SIZE: tuple[int, int] = (500, 375)
PHOTO_DEFAULT_QUALITY = 97
_SPLITS = {"train": 0, "test": 1}
_MIN_AREA, _MAX_AREA = 0.35, 1.0
_ASPECT_JITTER = 0.1
_MAX_ROTATION_DEG = 10.0
_GRAIN_SIGMA = 4.0
_LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R 601-2, as PIL's convert("L")
# Photos are first reduced so that the full-photo view is at most this many source pixels per
# output pixel: bilinear sampling does not low-pass, and stronger reduction would alias.
_MAX_SOURCE_SCALE = 1.3
_PLACEMENT_TRIES = 10
# Below this many images a process pool costs more to start than it saves.
_POOL_MIN_SAMPLES = 200


@cache
def load_photo(name: str) -> np.ndarray:
    """The RGB uint8 pixels (read-only) of one of ``PHOTO_CLASSES``, from the installed wheels."""
    if name not in PHOTO_CLASSES:
        raise SourceError(f"unknown photo {name!r}; choose from {', '.join(PHOTO_CLASSES)}")
    try:
        if name in ("china", "flower"):
            from sklearn.datasets import load_sample_image

            pixels = load_sample_image(f"{name}.jpg")
        else:
            import skimage.data

            pixels = (
                skimage.data.stereo_motorcycle()[0]
                if name == "motorcycle"
                else getattr(skimage.data, name)()
            )
    except Exception as exc:  # any loader failure means the same thing to the user
        raise SourceError(f"cannot load photo {name!r}: {exc}") from exc
    rgb = np.ascontiguousarray(np.asarray(pixels)[..., :3], dtype=np.uint8)
    rgb.setflags(write=False)  # cached and shared: nobody may change it
    return rgb


class _Renderer:
    """Renders sample ``i`` to JPEG bytes; holds the reduced photos and the grain tile."""

    def __init__(
        self, classes: Sequence[str], size: tuple[int, int], seed: int, split: int, quality: int
    ) -> None:
        self.width, self.height = size
        self.seed, self.split, self.quality = seed, split, quality
        self.photos = [self._reduce(Image.fromarray(load_photo(name))) for name in classes]
        grain = np.random.default_rng((seed, 2**31)).normal(
            128.0, _GRAIN_SIGMA, size=(2 * self.height, 2 * self.width, 3)
        )
        self.grain = Image.fromarray(np.clip(np.rint(grain), 0, 255).astype(np.uint8))

    def _reduce(self, photo: Image.Image) -> Image.Image:
        scale = min(photo.width / self.width, photo.height / self.height)
        if scale <= _MAX_SOURCE_SCALE:
            return photo
        factor = _MAX_SOURCE_SCALE / scale
        size = (round(photo.width * factor), round(photo.height * factor))
        return photo.resize(size, Image.Resampling.LANCZOS)

    def _affine(self, photo: Image.Image, rng: np.random.Generator) -> tuple[float, ...]:
        """Coefficients mapping output pixels to photo pixels for a random view that fits."""
        w, h = self.width, self.height
        fit = min(photo.width / w, photo.height / h)
        flip = -1.0 if rng.random() < 0.5 else 1.0
        for _ in range(_PLACEMENT_TRIES):
            scale = fit * math.sqrt(rng.uniform(_MIN_AREA, _MAX_AREA))
            sx = scale * rng.uniform(1 - _ASPECT_JITTER, 1 + _ASPECT_JITTER)
            sy = scale
            angle = math.radians(rng.uniform(-_MAX_ROTATION_DEG, _MAX_ROTATION_DEG))
            cos, sin = math.cos(angle), math.sin(angle)
            half_x = abs(cos * sx * w / 2) + abs(sin * sy * h / 2)
            half_y = abs(sin * sx * w / 2) + abs(cos * sy * h / 2)
            if 2 * half_x < photo.width and 2 * half_y < photo.height:
                break
        else:  # an unrotated view of 95 % of the fitting box always fits
            sx = sy = 0.95 * fit
            cos, sin = 1.0, 0.0
            half_x, half_y = sx * w / 2, sy * h / 2
        cx = rng.uniform(half_x, photo.width - half_x)
        cy = rng.uniform(half_y, photo.height - half_y)
        a, b = cos * sx * flip, -sin * sy
        d, e = sin * sx * flip, cos * sy
        return (a, b, cx - a * w / 2 - b * h / 2, d, e, cy - d * w / 2 - e * h / 2)

    @staticmethod
    def _colour_matrix(rng: np.random.Generator) -> tuple[float, ...]:
        """Saturation, contrast, brightness and per-channel gain folded into one 3x4 matrix.

        All four are affine in the pixel value, so one ``convert`` pass (clipping included)
        applies them: out = gain * (contrast * (s * x + (1 - s) * luma) + 128 (1 - contrast) + b).
        """
        saturation = rng.uniform(0.7, 1.3)
        contrast, brightness = rng.uniform(0.8, 1.2), rng.uniform(-20.0, 20.0)
        gains = rng.uniform(0.9, 1.1, size=3)
        mix = saturation * np.eye(3) + (1.0 - saturation) * np.tile(_LUMA, (3, 1))
        rows = contrast * mix * gains[:, None]
        offsets = gains * (128.0 * (1.0 - contrast) + brightness)
        return tuple(float(v) for v in np.column_stack([rows, offsets]).ravel())

    def render(self, index: int) -> bytes:
        rng = np.random.default_rng((self.seed, self.split, index))
        photo = self.photos[index % len(self.photos)]
        # Nearest-neighbour sampling at twice the resolution, then a 2x2 box average: an
        # antialiased resampling that costs ~60 % of Pillow's (unvectorised) bilinear transform.
        a, b, c, d, e, f = self._affine(photo, rng)
        fine = (a / 2, b / 2, c, d / 2, e / 2, f)  # Pillow samples at pixel centres (x + 0.5)
        view = photo.transform(
            (2 * self.width, 2 * self.height),
            Image.Transform.AFFINE,
            fine,
            resample=Image.Resampling.NEAREST,
        ).reduce(2)
        view = view.convert("RGB", self._colour_matrix(rng))
        ox = int(rng.integers(0, self.width))
        oy = int(rng.integers(0, self.height))
        grain = self.grain.crop((ox, oy, ox + self.width, oy + self.height))
        view = ImageChops.add(view, grain, scale=1.0, offset=-128)
        buffer = io.BytesIO()
        view.save(buffer, format="JPEG", quality=self.quality)
        return buffer.getvalue()


_worker_renderer: _Renderer | None = None


def _init_worker(
    classes: Sequence[str], size: tuple[int, int], seed: int, split: int, quality: int
) -> None:
    global _worker_renderer
    _worker_renderer = _Renderer(classes, size, seed, split, quality)


def _render_range(start: int, stop: int) -> list[bytes]:
    assert _worker_renderer is not None, "worker initializer did not run"
    return [_worker_renderer.render(index) for index in range(start, stop)]


class PhotoSource(ImageSource):
    """ImageNet-sized JPEG views of real photos, one class per photo (see the module docstring).

    Args:
        split: ``"train"`` or ``"test"`` (different views of the same photos).
        per_class: images per class.
        size: (width, height) of every image.
        seed: the seed everything is drawn from.
        quality: JPEG quality (1-100); the default gives about 110 KB at 500x375.
        classes: a subset of ``PHOTO_CLASSES`` (default all ten), in the order given.
        workers: processes rendering in parallel; None picks ``os.cpu_count()`` (at most 8) for
            ``>= 200`` images and 1 otherwise. The output does not depend on it.
    """

    def __init__(
        self,
        split: Literal["train", "test"] = "train",
        *,
        per_class: int = 100,
        size: tuple[int, int] = PHOTO_DEFAULT_SIZE,
        seed: int = 0,
        quality: int = PHOTO_DEFAULT_QUALITY,
        classes: Sequence[str] | None = None,
        workers: int | None = None,
    ) -> None:
        if split not in _SPLITS:
            raise SourceError(f"photos split must be 'train' or 'test', not {split!r}")
        if per_class < 1:
            raise SourceError(f"per_class must be >= 1, got {per_class}")
        if not (16 <= size[0] <= 4096 and 16 <= size[1] <= 4096):
            raise SourceError(f"size must be between 16x16 and 4096x4096, got {size[0]}x{size[1]}")
        if not 1 <= quality <= 100:
            raise SourceError(f"quality must be in 1..100, got {quality}")
        if workers is not None and workers < 1:
            raise SourceError(f"workers must be >= 1, got {workers}")
        chosen = tuple(PHOTO_CLASSES if classes is None else classes)
        unknown = [name for name in chosen if name not in PHOTO_CLASSES]
        if unknown or not chosen or len(set(chosen)) != len(chosen):
            raise SourceError(
                f"photo classes must be distinct names from {', '.join(PHOTO_CLASSES)}; "
                f"got {', '.join(chosen) or 'none'}"
            )
        params = [f"per_class={per_class}", f"size={size[0]}x{size[1]}", f"seed={seed}"]
        params.append(f"quality={quality}")
        if classes is not None:
            params.append(f"classes={','.join(chosen)}")
        super().__init__(chosen, f"photos:{split}?{'&'.join(params)}")
        self._args = (chosen, (int(size[0]), int(size[1])), seed, _SPLITS[split], quality)
        self._count = per_class * len(chosen)
        self._workers = workers

    def __len__(self) -> int:
        return self._count

    def _worker_count(self) -> int:
        if self._workers is not None:
            return self._workers
        if self._count < _POOL_MIN_SAMPLES:
            return 1
        return max(1, min(os.cpu_count() or 1, 8))

    def __iter__(self) -> Iterator[SourceSample]:
        workers = self._worker_count()
        if workers == 1:
            renderer = _Renderer(*self._args)
            images: Iterator[bytes] = map(renderer.render, range(self._count))
            for index, image in enumerate(images):
                yield SourceSample(image, "jpg", index % len(self.classes))
            return
        # fork: the workers inherit the loaded modules instead of re-importing numpy/PIL/torch.
        context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        chunk = max(1, min(16, self._count // (4 * workers)))
        starts = iter(range(0, self._count, chunk))
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_init_worker, initargs=self._args
        ) as pool:
            # A bounded window of chunks in flight keeps memory flat however many images follow.
            pending: deque[Future[list[bytes]]] = deque()
            for start in itertools.islice(starts, 2 * workers):
                pending.append(pool.submit(_render_range, start, min(start + chunk, self._count)))
            index = 0
            while pending:
                for image in pending.popleft().result():
                    yield SourceSample(image, "jpg", index % len(self.classes))
                    index += 1
                for start in itertools.islice(starts, 1):
                    pending.append(
                        pool.submit(_render_range, start, min(start + chunk, self._count))
                    )
