"""InputTransform.decode_batch: an image that does not decode is named by the caller's names."""

from __future__ import annotations

import io

import hapi_models as hm
import numpy as np
import pytest
from PIL import Image

SMALL = hm.InputTransform(resize=32, crop=32)


def _jpeg(seed: int) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def test_a_truncated_image_is_named_by_its_entry_in_names() -> None:
    good, cut = _jpeg(0), _jpeg(1)
    cut = cut[: len(cut) // 2]  # its header opens; its body does not decode
    names = ["photos/img/0000.jpg", "photos/img/0001.jpg"]
    with pytest.raises(hm.ImageDecodeError) as info:
        SMALL.decode_batch([good, cut], names=names)
    assert str(info.value).startswith("photos/img/0001.jpg: cannot decode image")
    assert "truncated" in str(info.value)
    assert "0000" not in str(info.value)


def test_an_image_over_the_pixel_limit_is_named_too() -> None:
    with pytest.raises(hm.ImageDecodeError, match=r"^shard c/s\.tar: sample k1: image of 48x40"):
        SMALL.decode_batch([_jpeg(2)], max_pixels=100, names=["shard c/s.tar: sample k1"])


def test_names_must_match_the_images() -> None:
    with pytest.raises(ValueError, match="1 names for 2 images"):
        SMALL.decode_batch([_jpeg(0), _jpeg(1)], names=["only one"])


def test_good_images_decode_the_same_with_or_without_names() -> None:
    images = [_jpeg(0), _jpeg(1)]
    named = SMALL.decode_batch(images, names=["a", "b"])
    assert named.shape == (2, 3, 32, 32)
    assert named.equal(SMALL.decode_batch(images))
