"""The batched GPU decode (nvJPEG through torchvision) gives the CPU fast path's input."""

from __future__ import annotations

import io

import hapi_models as hm
import numpy as np
import pytest
import torch
from PIL import Image

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

T = hm.InputTransform(resize=40, crop=32)
# Resize in float32 on the GPU, in uint8 on the CPU: one grey level apart at most.
CLOSE = {"rtol": 0.0, "atol": 1.5 / 255 / min(T.std)}


def _jpeg(seed: int, size: tuple[int, int] = (64, 48), mode: str = "RGB") -> bytes:
    arr = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("P", (50, 45), 3).save(buf, format="PNG")
    return buf.getvalue()


def test_a_mixed_batch_decodes_on_the_gpu_as_on_the_cpu() -> None:
    images = [_jpeg(0), _jpeg(1, mode="L"), _jpeg(2, mode="CMYK"), _png(), _jpeg(3, (200, 150))]
    got = T.decode_batch_cuda(images, "cuda")
    assert got.device.type == "cuda" and got.shape == (5, 3, 32, 32)
    torch.testing.assert_close(got.cpu(), T.decode_batch(images), **CLOSE)


def test_a_truncated_jpeg_in_a_gpu_batch_is_named() -> None:
    cut = _jpeg(5, (320, 240))
    with pytest.raises(hm.ImageDecodeError, match=r"^b\.jpg: cannot decode image"):
        T.decode_batch_cuda([_jpeg(4), cut[: len(cut) // 2]], "cuda", names=["a.jpg", "b.jpg"])


def test_the_pixel_limit_holds_before_the_gpu_decodes() -> None:
    with pytest.raises(hm.ImageDecodeError, match=r"^a\.jpg: image of 64x48 pixels exceeds"):
        T.decode_batch_cuda([_jpeg(6)], "cuda", max_pixels=100, names=["a.jpg"])
