"""Hostile inputs shared by the bad-input tests of the server and of the proxy filter."""

from __future__ import annotations

import http.client
import struct
import zlib
from urllib.parse import urlsplit

from .conftest import make_images

BOMB_SIDE = (20_000, 10_000)
"""200 M pixels: over twice Pillow's own limit (89.5 M), where Image.open refuses outright."""


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(width: int = BOMB_SIDE[0], height: int = BOMB_SIDE[1]) -> bytes:
    """A 1-bit greyscale PNG claiming ``width`` x ``height`` pixels in a few dozen bytes."""
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )


def truncated_jpeg() -> bytes:
    """A real JPEG cut in half: its header opens, its body does not decode."""
    rich, _ = make_images(1, seed=5)
    return rich[0][: len(rich[0]) // 2]


NOT_JPEG = b"\xff\xd8\xff" + b"this is not an image " * 20
"""JPEG magic bytes, then nothing an image decoder accepts."""


def deep_json(depth: int) -> bytes:
    """A JSON object whose ``model`` nests ``depth`` arrays deep."""
    return b'{"model": ' + b"[" * depth + b"]" * depth + b"}"


def raw_post(base_url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """POST ``path`` exactly as written: httpx (like any RFC 3986 client) would resolve dot
    segments before sending, and these tests are about what a server does with them."""
    parts = urlsplit(base_url)
    assert parts.hostname is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request(
            "POST", path, body=body, headers={"Content-Type": "application/json", **headers}
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
