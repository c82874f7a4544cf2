"""Input transforms: how stored image bytes become the tensor the first layer sees.

The transform is part of a model's definition (each registry entry carries its default) and
travels with every HAPI request, so the server and the client (BASELINE mode) decode identical
bytes into identical tensors through this one function.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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

    def decode_batch(
        self,
        images: Sequence[bytes],
        *,
        max_pixels: int | None = None,
        names: Sequence[str] | None = None,
    ) -> torch.Tensor:
        """Decode encoded images (JPEG/PNG bytes) and stack them into an ``[N, 3, crop, crop]`` batch.

        ``names`` says where each image came from (its object, or its shard and key): an
        image that does not decode is an :class:`ImageDecodeError` led by its name, since a
        header check before cannot find a body cut short and the caller must know which of
        thousands of objects to fix.
        """
        if names is not None and len(names) != len(images):
            raise ValueError(f"{len(names)} names for {len(images)} images")
        pipe = self.pipeline()
        out = torch.empty((len(images), *self.input_shape), dtype=torch.float32)
        for i, data in enumerate(images):
            try:
                image = decode_image(data, max_pixels=max_pixels)
            except ImageDecodeError as exc:
                if names is None:
                    raise
                raise ImageDecodeError(f"{names[i]}: {exc}") from exc
            out[i] = pipe(image)
        return out


def decode_image(data: bytes, *, max_pixels: int | None = None) -> Image.Image:
    """Decode one encoded image to RGB, refusing more than ``max_pixels`` before decoding it."""
    try:
        img = Image.open(io.BytesIO(data))
        if max_pixels is not None and img.width * img.height > max_pixels:
            raise ImageDecodeError(
                f"image of {img.width}x{img.height} pixels exceeds the limit of {max_pixels} pixels"
            )
        img.load()
    except ImageDecodeError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageDecodeError(f"cannot decode image: {exc}") from exc
    return img.convert("RGB")
