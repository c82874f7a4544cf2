"""Checks of what a request names and what Swift hands back, shared by every execution path.

``/v1/extract``, ``/v1/finetune`` and the proxy filter's in-proxy execution refuse the same bad
input with the same status and code because they all call these functions: Swift names with
dot segments (422), shards that are not dataset tars (422) or hold too many samples (413),
images that do not decode (422) or are too large, decompression bombs included (413). The
functions are synchronous and cheap (headers only, nothing decoded); run the shard checks in a
worker thread.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from hapi_contract import DatasetFormatError, ImageData, has_dot_segment, read_shard

from .errors import (
    InvalidNameError,
    InvalidRequestError,
    InvalidShardError,
    PayloadTooLargeError,
)

__all__ = [
    "check_images",
    "check_named_images",
    "check_swift_name",
    "check_weights_size",
    "parse_shard",
]


def check_swift_name(value: str, what: str, *, segmented: bool = False) -> None:
    """Refuse ``.`` and ``..`` as a name (``segmented``: as any ``/``-separated segment of it).

    HTTP libraries, proxies and RFC 3986 resolve dot segments, so a URL holding one can reach
    another object than the one named (and authorised). Refusing them keeps "the object that
    is authorised" and "the object that is read" the same bytes.
    """
    if has_dot_segment(value, segmented=segmented):
        raise InvalidNameError(
            f"{what} name {value!r} has a '.' or '..' path segment; such names are refused "
            "because a URL holding them can name another object"
        )


def check_images(images: list[ImageData], max_pixels: int) -> None:
    """Open every image's header (no pixel decoded): 422 if unreadable, 413 if too large."""
    check_named_images(images, [f"sample {i}" for i in range(len(images))], max_pixels)


def check_named_images(images: list[ImageData], names: list[str], max_pixels: int) -> None:
    """:func:`check_images`, each error led by the image's name in ``names`` (e.g. its object)."""
    for name, data in zip(names, images, strict=True):
        try:
            with warnings.catch_warnings():
                # Between one and two times Pillow's own limit it only warns; ours decides.
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(data)) as img:
                    pixels = img.width * img.height
        except Image.DecompressionBombError as exc:
            # Over twice Pillow's limit it refuses to open at all: still "too large", not broken.
            raise PayloadTooLargeError(
                f"{name}: image over the pixel limit (decompression bomb: {exc})"
            ) from exc
        except UnidentifiedImageError as exc:
            # PIL's message names an in-memory buffer object; say what it means instead.
            raise InvalidShardError(
                f"{name}: not a decodable image (unknown or corrupt image format)"
            ) from exc
        except (OSError, ValueError, SyntaxError) as exc:
            # Pillow's plugins raise these for headers that parse but make no sense.
            raise InvalidShardError(f"{name}: not a decodable image ({exc})") from exc
        if pixels > max_pixels:
            raise PayloadTooLargeError(
                f"{name}: {pixels} pixels exceeds the limit of {max_pixels} (max_image_pixels)"
            )


def parse_shard(
    data: bytes,
    what: str,
    *,
    max_samples: int,
    max_pixels: int,
    num_classes: int,
) -> tuple[list[ImageData], list[int]]:
    """A shard's images and labels, checked: the format (422), the sample count and every
    image's header (413 / 422). ``what`` names the shard in the messages."""
    try:
        # A tar member takes at least 512 bytes and a sample two members, so this bound never
        # cuts a shard short: the sample limit is checked on the count below, by number rather
        # than by telling read_shard's one error type apart by its message.
        samples = read_shard(data, max_samples=len(data) // 1024 + 1, num_classes=num_classes)
    except DatasetFormatError as exc:
        raise InvalidShardError(f"shard {what}: {exc}") from exc
    if len(samples) > max_samples:
        raise PayloadTooLargeError(
            f"shard {what}: {len(samples)} samples, more than {max_samples} samples "
            "(max_samples_per_request)"
        )
    images = [s.image_bytes for s in samples]
    try:
        check_images(images, max_pixels)
    except (PayloadTooLargeError, InvalidShardError) as exc:
        raise type(exc)(f"shard {what}: {exc.detail}") from exc
    return images, [s.label for s in samples]


# Room a safetensors header takes beyond the key names: per tensor its dtype, shape and
# offsets (about 70 bytes as written), plus the blob's metadata. Generous on purpose: this
# check only has to tell "these weights cannot be that model" apart, cheaply.
_HEADER_BYTES_PER_TENSOR = 256
_HEADER_METADATA_BYTES = 64 * 1024


def check_weights_size(
    size: int | None,
    *,
    state_bytes: int,
    state_key_bytes: int,
    num_tensors: int,
    max_bytes: int,
    what: str,
    model: str,
) -> None:
    """Refuse a weights object by its size alone, before a byte of it is read or a model built.

    A safetensors blob of a model's state dict is the tensors' bytes plus a header, so an
    object much smaller or larger than that cannot be these weights (422); one over
    ``max_bytes`` is 413. ``size`` None (unknown) passes: the full load still checks.
    Weights are expected in the model's own dtypes, as ``hapi_models.weights_to_bytes``
    writes them.
    """
    if state_bytes > max_bytes:
        raise PayloadTooLargeError(
            f"{model} has {state_bytes} bytes of weights, over the limit of {max_bytes} bytes "
            "(max_weights_bytes)"
        )
    if size is None:
        return
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"{what} is {size} bytes, over the limit of {max_bytes} bytes (max_weights_bytes)"
        )
    header_max = state_key_bytes + _HEADER_BYTES_PER_TENSOR * num_tensors + _HEADER_METADATA_BYTES
    if not state_bytes + 8 < size <= state_bytes + 8 + header_max:
        raise InvalidRequestError(
            f"{what} is {size} bytes but the weights of {model} take {state_bytes} bytes "
            "(plus a header): they are the weights of another model or class count"
        )
