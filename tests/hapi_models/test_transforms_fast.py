"""The fast decode path (libjpeg-turbo into uint8, batched normalisation) against the PIL path.

Both paths must give the model the same input: the client's BASELINE and verification decode
through the same function as the server, and the PIL path stays selectable for the benchmark.
"""

from __future__ import annotations

import io

import hapi_models as hm
import numpy as np
import pytest
import torch
import torchvision.io
from PIL import Image

T = hm.InputTransform(resize=40, crop=32)
# The same libjpeg-turbo DCT behind both libraries; a different build may round an odd pixel.
CLOSE = {"rtol": 0.0, "atol": 2 / 255 / min(hm.InputTransform().std)}


def _photo(width: int = 64, height: int = 48, seed: int = 0) -> Image.Image:
    yy, xx = np.mgrid[0:height, 0:width]
    noise = np.random.default_rng(seed).integers(0, 40, (height, width, 3))
    arr = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) % 256], axis=-1) + noise
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _encode(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


CASES = {
    "rgb-jpeg": lambda: _encode(_photo(), "JPEG", quality=90),
    "progressive-jpeg": lambda: _encode(_photo(), "JPEG", quality=90, progressive=True),
    "grey-jpeg": lambda: _encode(_photo().convert("L"), "JPEG", quality=90),
    "cmyk-jpeg": lambda: _encode(_photo().convert("CMYK"), "JPEG", quality=90),
    "png": lambda: _encode(_photo(), "PNG"),
    "palette-png": lambda: _encode(_photo().convert("P"), "PNG"),
    "rgba-png": lambda: _encode(_photo().convert("RGBA"), "PNG"),
    "grey-png": lambda: _encode(_photo().convert("L"), "PNG"),
    "webp": lambda: _encode(_photo(), "WEBP", quality=90),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fast_path_gives_the_pil_path_s_input(case: str) -> None:
    data = CASES[case]()
    fast = T.decode_batch([data, data], path="fast")
    old = T.decode_batch([data, data], path="pil")
    assert fast.shape == old.shape == (2, 3, 32, 32)
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast, old, **CLOSE)


def test_the_fast_path_is_the_default() -> None:
    data = CASES["rgb-jpeg"]()
    assert T.decode_batch([data]).equal(T.decode_batch([data], path="fast"))


def test_a_jpeg_decodes_through_libjpeg_turbo(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = torchvision.io.decode_jpeg

    def counting(*args: object, **kw: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(torchvision.io, "decode_jpeg", counting)
    T.decode_batch([CASES["rgb-jpeg"](), CASES["cmyk-jpeg"](), CASES["png"]()])
    assert len(calls) == 1  # the RGB JPEG; CMYK and PNG go through PIL


def test_the_pixel_limit_holds_before_any_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kw: object) -> torch.Tensor:
        raise AssertionError("decoded an image over the pixel limit")

    monkeypatch.setattr(torchvision.io, "decode_jpeg", refuse)
    with pytest.raises(hm.ImageDecodeError, match=r"^a\.jpg: image of 64x48 pixels exceeds"):
        T.decode_batch([CASES["rgb-jpeg"]()], max_pixels=1000, names=["a.jpg"])


def test_a_truncated_jpeg_is_refused_by_name_on_the_fast_path() -> None:
    data = _encode(_photo(320, 240), "JPEG", quality=90)
    with pytest.raises(hm.ImageDecodeError, match=r"^c/0001\.jpg: cannot decode image.*truncated"):
        T.decode_batch([data[: len(data) // 2]], names=["c/0001.jpg"], path="fast")


def test_a_large_jpeg_decodes_at_a_reduced_scale_close_to_the_full_decode() -> None:
    # 256x192 to a 40-pixel shorter side: libjpeg decodes at 1/2 scale (128x96, at least twice
    # the target), then the resize does the rest.
    data = _encode(_photo(256, 192), "JPEG", quality=95)
    assert tuple(hm.decode_pixels(data, resize=40).shape) == (3, 96, 128)
    assert tuple(hm.decode_pixels(data, resize=60).shape) == (3, 192, 256)  # under 4x: whole
    assert tuple(hm.decode_pixels(data).shape) == (3, 192, 256)
    fast = T.decode_batch([data])
    old = T.decode_batch([data], path="pil")
    assert ((fast - old).norm() / old.norm()).item() < 0.05


def test_an_unknown_decode_path_is_refused() -> None:
    with pytest.raises(ValueError, match="decode path must be one of"):
        T.decode_batch([CASES["png"]()], path="gpu")  # type: ignore[arg-type]
