"""Input transforms: how stored image bytes become the tensor the first layer sees.

The transform is part of a model's definition (each registry entry carries its default) and
travels with every HAPI request, so the server and the client (BASELINE mode) decode identical
bytes into identical tensors through this one function.

Two decode paths (:data:`DecodePath`), both read the image's header first, so the pixel and
decompression-bomb limits hold before a single pixel is decoded:

* ``"fast"`` (the default, on both sides): a baseline or progressive RGB/greyscale JPEG decodes
  through libjpeg-turbo in ``torchvision.io.decode_jpeg`` straight into a uint8 tensor; one at
  least four times the resize target decodes at a reduced DCT scale (PIL's ``draft``), so a 12 MP
  photo never materialises at full size; everything else (CMYK, PNG, WebP, palette, alpha, a
  JPEG with no end marker) decodes through PIL as before. Resize and crop run per image on
  uint8, the float conversion and normalisation once per batch.
* ``"pil"``: the previous path, kept for the roofline benchmark's side-by-side comparison.

The decoded pixels of a JPEG are the same through either library (both are libjpeg-turbo with
its default DCT and upsampling), so the two paths give equal features except where ``draft``
reduces the decode.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Literal, TypeAlias

import numpy as np
import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

DecodePath = Literal["fast", "pil"]
#: An encoded image as the readers hand it on: often a read-only view of the shard it was read
#: with, never copied whole (issue 27).
EncodedImage: TypeAlias = bytes | bytearray | memoryview
DECODE_PATHS: tuple[DecodePath, ...] = ("fast", "pil")

# The modes libjpeg-turbo turns into RGB exactly as PIL's convert("RGB") does; CMYK/YCCK JPEGs
# (Adobe's inverted CMYK among them) are left to PIL, which knows their conventions.
_TURBO_MODES = frozenset({"RGB", "L"})
_JPEG_END = b"\xff\xd9"


class ImageDecodeError(ValueError):
    """Bytes that are not a decodable image (or one over the pixel limit)."""


@dataclass(frozen=True)
class InputTransform:
    """Resize the shorter side to ``resize``, centre-crop ``crop`` x ``crop``, normalise.

    Greyscale and palette images are converted to RGB so every model sees 3 channels.
    """

    resize: int = 256
    crop: int = 224
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        if not 1 <= self.crop <= self.resize:
            raise ValueError(
                f"crop must be in [1, resize]; got crop={self.crop}, resize={self.resize}"
            )
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std must be positive; got {self.std}")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, self.crop, self.crop)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def pipeline(self) -> Callable[[Image.Image], torch.Tensor]:
        # Imported here: torchvision takes seconds to import, and only decoding needs it.
        from torchvision.transforms import v2

        return v2.Compose(
            [
                v2.PILToTensor(),
                v2.Resize(self.resize, interpolation=v2.InterpolationMode.BILINEAR, antialias=True),
                v2.CenterCrop(self.crop),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(list(self.mean), list(self.std)),
            ]
        )

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.pipeline()(image.convert("RGB"))

    def decode_uint8(self, data: EncodedImage, *, max_pixels: int | None = None) -> torch.Tensor:
        """One image through the fast path up to its ``[3, crop, crop]`` uint8 crop.

        The unit of work a decode pool runs; :meth:`normalize` turns a stack of them into the
        model's input.
        """
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as F

        pixels = decode_pixels(data, max_pixels=max_pixels, resize=self.resize)
        resized = F.resize(pixels, self.resize, InterpolationMode.BILINEAR, antialias=True)
        return F.center_crop(resized, [self.crop, self.crop])

    def normalize(self, batch: torch.Tensor) -> torch.Tensor:
        """A uint8 ``[N, 3, crop, crop]`` batch as the float32 input, scaled and normalised."""
        from torchvision.transforms.v2 import functional as F

        x = F.to_dtype(batch, torch.float32, scale=True)
        return F.normalize(x, list(self.mean), list(self.std))

    def decode_batch(
        self,
        images: Sequence[EncodedImage],
        *,
        max_pixels: int | None = None,
        names: Sequence[str] | None = None,
        path: DecodePath = "fast",
    ) -> torch.Tensor:
        """Decode encoded images (JPEG/PNG bytes) and stack them into an ``[N, 3, crop, crop]`` batch.

        ``names`` says where each image came from (its object, or its shard and key): an
        image that does not decode is an :class:`ImageDecodeError` led by its name, since a
        header check before cannot find a body cut short and the caller must know which of
        thousands of objects to fix. ``path`` picks the decode (see the module docstring).
        """
        if names is not None and len(names) != len(images):
            raise ValueError(f"{len(names)} names for {len(images)} images")
        if path not in DECODE_PATHS:
            raise ValueError(f"decode path must be one of {DECODE_PATHS}, not {path!r}")
        if path == "pil":
            return self._decode_batch_pil(images, max_pixels, names)
        out = torch.empty((len(images), *self.input_shape), dtype=torch.uint8)
        for i, data in enumerate(images):
            with named_errors(names, i):
                out[i] = self.decode_uint8(data, max_pixels=max_pixels)
        return self.normalize(out)

    def decode_batch_cuda(
        self,
        images: Sequence[EncodedImage],
        device: torch.device | str,
        *,
        max_pixels: int | None = None,
        names: Sequence[str] | None = None,
    ) -> torch.Tensor:
        """The fast path on a GPU: the batch's JPEGs decode in one batched nvJPEG call.

        Every header and the pixel limit are checked on the CPU first, as on the CPU path.
        Images nvJPEG does not take (see :func:`decode_pixels`' fallbacks) decode on the CPU and
        join the batch; a batch nvJPEG refuses as a whole decodes image by image on the CPU, so
        that the broken one is named. Resize runs in float32 on the GPU (its uint8 kernel is the
        CPU's): equal to the CPU path within one grey level.
        """
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as F

        if names is not None and len(names) != len(images):
            raise ValueError(f"{len(names)} names for {len(images)} images")
        gpu: list[int] = []
        pixels: list[torch.Tensor | None] = [None] * len(images)
        for i, data in enumerate(images):
            with named_errors(names, i):
                img = _open(data, max_pixels)
                # A large JPEG takes the CPU's reduced DCT decode, as on the client: the same
                # pixels on both sides, and a 12 MP image never whole in GPU memory.
                if _turbo_jpeg(img, data) and min(img.size) < 4 * self.resize:
                    gpu.append(i)
                else:
                    pixels[i] = decode_pixels(data, resize=self.resize).to(device)
        if gpu:
            encoded = [torch.frombuffer(bytearray(images[i]), dtype=torch.uint8) for i in gpu]
            try:
                decoded = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device)
            except RuntimeError:
                decoded = []
                for i in gpu:
                    with named_errors(names, i):
                        decoded.append(decode_pixels(images[i], max_pixels=max_pixels).to(device))
            for i, tensor in zip(gpu, decoded, strict=True):
                pixels[i] = tensor
        out = torch.empty((len(images), *self.input_shape), dtype=torch.float32, device=device)
        for i, tensor in enumerate(pixels):
            assert tensor is not None
            resized = F.resize(
                tensor.float(), self.resize, InterpolationMode.BILINEAR, antialias=True
            )
            out[i] = F.center_crop(resized, [self.crop, self.crop]).round_().clamp_(0, 255)
        return F.normalize(out.div_(255), list(self.mean), list(self.std))

    def _decode_batch_pil(
        self, images: Sequence[EncodedImage], max_pixels: int | None, names: Sequence[str] | None
    ) -> torch.Tensor:
        pipe = self.pipeline()
        out = torch.empty((len(images), *self.input_shape), dtype=torch.float32)
        for i, data in enumerate(images):
            with named_errors(names, i):
                image = decode_image(data, max_pixels=max_pixels)
            out[i] = pipe(image)
        return out


@contextmanager
def named_errors(names: Sequence[str] | None, index: int) -> Iterator[None]:
    """Lead an :class:`ImageDecodeError` of image ``index`` with its entry in ``names``."""
    try:
        yield
    except ImageDecodeError as exc:
        if names is None:
            raise
        raise ImageDecodeError(f"{names[index]}: {exc}") from exc


def _open(data: EncodedImage, max_pixels: int | None) -> Image.Image:
    """The image's header only (PIL reads no pixel yet), with the pixel limit checked."""
    try:
        img = Image.open(io.BytesIO(data))
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageDecodeError(f"cannot decode image: {exc}") from exc
    if max_pixels is not None and img.width * img.height > max_pixels:
        raise ImageDecodeError(
            f"image of {img.width}x{img.height} pixels exceeds the limit of {max_pixels} pixels"
        )
    return img


def _load(img: Image.Image) -> Image.Image:
    try:
        img.load()
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageDecodeError(f"cannot decode image: {exc}") from exc
    return img.convert("RGB")


def decode_image(data: EncodedImage, *, max_pixels: int | None = None) -> Image.Image:
    """Decode one encoded image to RGB, refusing more than ``max_pixels`` before decoding it."""
    return _load(_open(data, max_pixels))


def decode_pixels(
    data: EncodedImage, *, max_pixels: int | None = None, resize: int | None = None
) -> torch.Tensor:
    """Decode one encoded image to a ``[3, H, W]`` uint8 RGB tensor by the fast path.

    ``resize``: the shorter side the caller resizes to; a JPEG at least four times that decodes
    at the largest DCT scale (1/2, 1/4, 1/8) that keeps its shorter side at twice it or more.
    """
    img = _open(data, max_pixels)
    if not _turbo_jpeg(img, data):
        return _pil_tensor(_load(img))
    if resize is not None and min(img.size) >= 4 * resize:
        # Down to twice the target at most: the resize's antialiasing filter still does the
        # last 2x or more, so the DCT's own scaling does not set the image's high frequencies
        # (reduced to the target itself, features moved 7 % relative; see docs/server.md).
        scale = 2 * resize / min(img.size)
        img.draft("RGB", (int(img.width * scale + 0.999), int(img.height * scale + 0.999)))
        return _pil_tensor(_load(img))
    from torchvision.io import ImageReadMode, decode_jpeg

    # A writable copy (about 100 KB): torch warns about tensors over read-only bytes.
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    try:
        return decode_jpeg(encoded, mode=ImageReadMode.RGB)
    except RuntimeError:
        # A body libjpeg-turbo refuses: PIL's decode says why, as the old path did.
        return _pil_tensor(_load(img))


def _turbo_jpeg(img: Image.Image, data: EncodedImage) -> bool:
    """A JPEG libjpeg-turbo (or nvJPEG) decodes as PIL would: RGB or grey, with its end marker."""
    return (
        img.format == "JPEG"
        and img.mode in _TURBO_MODES
        and bytes(data[-len(_JPEG_END) :]) == _JPEG_END
    )


def _pil_tensor(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)
