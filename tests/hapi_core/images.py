"""Small test images for the core's unit tests."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def random_jpeg(seed: int) -> bytes:
    """A 48x40 JPEG of noise drawn from ``seed``."""
    arr = np.random.default_rng(seed).integers(0, 255, (40, 48, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=85)
    return buf.getvalue()
