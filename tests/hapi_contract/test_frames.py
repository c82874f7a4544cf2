"""The framed tensor stream: round trips, totals, truncation, corruption and limits."""

from __future__ import annotations

import asyncio
import json
import random
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import torch
import zstandard

from hapi_contract import (
    Compression,
    CorruptFrameError,
    OutputDtype,
    OversizedFrameError,
    OversizedHeaderError,
    RemoteStreamError,
    TruncatedStreamError,
)
from hapi_contract.frames import (
    MAGIC,
    BatchFrame,
    EndFrame,
    Frame,
    FrameDecoder,
    FrameEncoder,
    aiter_frames,
    encode_end,
    encode_error,
    iter_frames,
)

TORCH_DTYPE = {
    OutputDtype.FLOAT32: torch.float32,
    OutputDtype.FLOAT16: torch.float16,
    OutputDtype.BFLOAT16: torch.bfloat16,
}
# Largest relative rounding error of a round-to-nearest cast (unit roundoff): 2^-11 for
# float16 (10 stored mantissa bits), 2^-8 for bfloat16 (7 bits).
UNIT_ROUNDOFF = {OutputDtype.FLOAT16: 2.0**-11, OutputDtype.BFLOAT16: 2.0**-8}


# --- helpers -------------------------------------------------------------------------------


def make_batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Three batches of uneven size, as a server with COS batch 4 would send for 10 samples."""
    gen = torch.Generator().manual_seed(seed)
    batches, offset = [], 0
    for count in (4, 4, 2):
        # ReLU-like data with exact zeros and a spread of magnitudes (within float16 range).
        feats = torch.relu(torch.randn(count, 3, 5, 5, generator=gen)) * 10.0
        labels = torch.randint(0, 10, (count,), generator=gen)
        batches.append((feats, labels, offset))
        offset += count
    return batches


def make_stream(
    dtype: OutputDtype = OutputDtype.FLOAT32,
    compression: Compression = Compression.NONE,
    batches: list[tuple[torch.Tensor, torch.Tensor, int]] | None = None,
) -> tuple[list[bytes], bytes]:
    """(frames, whole body) of a stream of ``batches`` closed by an end frame."""
    enc = FrameEncoder(dtype=dtype, compression=compression)
    frames = [
        enc.batch(f, lab, off, meta={"cos_batch_size": 4, "i": i})
        for i, (f, lab, off) in enumerate(batches if batches is not None else make_batches())
    ]
    frames.append(enc.end(meta={"server_ms": 1.5, "cos_batch_sizes": [4]}))
    return frames, b"".join(frames)


def split_frame(frame: bytes) -> tuple[dict[str, Any], bytes]:
    (header_len,) = struct.unpack(">I", frame[5:9])
    return json.loads(frame[9 : 9 + header_len]), frame[9 + header_len :]


def raw_frame(
    header: dict[str, Any] | bytes, payload: bytes = b"", *, magic: bytes = MAGIC, version: int = 1
) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return magic + bytes([version]) + struct.pack(">I", len(raw)) + raw + payload


def chunkings(body: bytes) -> dict[str, Callable[[], Iterator[bytes]]]:
    def one_byte() -> Iterator[bytes]:
        return (body[i : i + 1] for i in range(len(body)))

    def random_sizes() -> Iterator[bytes]:
        rng, pos = random.Random(1234), 0
        while pos < len(body):
            step = rng.choice([0, 1, 2, 3, 7, 9, 64, 500, 4096])
            yield body[pos : pos + step]
            pos += step

    def whole() -> Iterator[bytes]:
        return iter([body])

    return {"one_byte": one_byte, "random": random_sizes, "whole": whole}


def decode_all(chunks: Iterator[bytes], **limits: int) -> tuple[list[BatchFrame], EndFrame]:
    decoder = FrameDecoder(**limits)
    frames: list[Frame] = []
    for chunk in chunks:
        frames.extend(decoder.feed(chunk))
    end = decoder.close()
    assert frames[-1] is end
    batches = [f for f in frames if isinstance(f, BatchFrame)]
    assert len(batches) == len(frames) - 1
    return batches, end


def feed_all(body: bytes, **limits: int) -> FrameDecoder:
    decoder = FrameDecoder(**limits)
    decoder.feed(body)
    return decoder


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", ["one_byte", "random", "whole"])
@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("dtype", list(OutputDtype))
def test_round_trip(dtype: OutputDtype, compression: Compression, chunking: str) -> None:
    batches = make_batches()
    _, body = make_stream(dtype, compression, batches)
    decoded, end = decode_all(chunkings(body)[chunking]())

    assert len(decoded) == len(batches)
    for i, (frame, (feats, labels, offset)) in enumerate(zip(decoded, batches, strict=True)):
        assert frame.offset == offset and frame.count == feats.shape[0]
        assert frame.dtype is dtype and frame.compression is compression
        assert frame.meta == {"cos_batch_size": 4, "i": i}
        assert frame.features.dtype == TORCH_DTYPE[dtype]
        assert frame.features.shape == feats.shape
        assert frame.labels.dtype == torch.int64 and torch.equal(frame.labels, labels)
        assert frame.float().dtype == torch.float32
        if dtype is OutputDtype.FLOAT32:
            assert torch.equal(frame.features, feats)  # bit-exact
        else:
            # Exactly what a local cast gives (round to nearest even)...
            assert torch.equal(frame.features, feats.to(TORCH_DTYPE[dtype]))
            # ...so within half an ulp, and not exact for this data.
            err = (frame.float() - feats).abs()
            assert torch.all(err <= feats.abs() * UNIT_ROUNDOFF[dtype])
            assert err.max() > 0

    assert end.samples == 10 and end.frames == 3
    assert end.payload_bytes == sum(f.payload_bytes for f in decoded)
    assert end.meta == {"server_ms": 1.5, "cos_batch_sizes": [4]}


def test_decoded_tensors_are_writable_and_independent() -> None:
    frames, body = make_stream(OutputDtype.FLOAT16, Compression.NONE)
    first, *_ = decode_all(iter([body]))[0]
    first.features.add_(1)  # would fail or corrupt memory on a read-only buffer
    first.labels.zero_()
    again, *_ = decode_all(iter([body]))[0]
    assert not torch.equal(first.features, again.features)


def test_encoder_accepts_awkward_inputs() -> None:
    base = torch.randn(6, 4, requires_grad=True)
    feats = (base * 2).t().t()[::2]  # non-contiguous, part of an autograd graph
    labels = torch.tensor([1, 2, 3], dtype=torch.int32)
    double = torch.randn(2, 3, dtype=torch.float64)
    batches = [(feats, labels, 7), (double, torch.tensor([0, 1]), 10)]
    (first, second), end = decode_all(
        iter(make_stream(compression=Compression.ZSTD, batches=batches)[0])
    )
    assert not feats.is_contiguous()
    assert torch.equal(first.features, feats.detach())
    assert first.labels.dtype == torch.int64 and first.labels.tolist() == [1, 2, 3]
    assert torch.equal(second.features, double.float())
    assert end.samples == 5


def test_zstd_shrinks_sparse_activations() -> None:
    feats = torch.relu(torch.randn(8, 64, 6, 6))
    labels = torch.zeros(8, dtype=torch.int64)
    raw = FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE).batch(
        feats, labels, 0
    )
    packed = FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.ZSTD).batch(
        feats, labels, 0
    )
    assert len(packed) < len(raw)
    header, _ = split_frame(packed)
    assert header["features"]["codec"] == "zstd"
    assert header["features"]["wire_nbytes"] < header["features"]["nbytes"] == 8 * 64 * 36 * 4


def test_iter_frames_returns_the_end_frame() -> None:
    _, body = make_stream()
    gen = iter_frames(chunkings(body)["random"]())
    got: list[BatchFrame] = []
    with pytest.raises(StopIteration) as stop:
        while True:
            got.append(next(gen))
    assert [f.offset for f in got] == [0, 4, 8]
    assert isinstance(stop.value.value, EndFrame) and stop.value.value.samples == 10


def test_aiter_frames() -> None:
    _, body = make_stream(OutputDtype.BFLOAT16, Compression.ZSTD)

    async def chunks(data: bytes) -> AsyncIterator[bytes]:
        for i in range(0, len(data), 100):
            yield data[i : i + 100]

    async def collect(data: bytes) -> list[int]:
        return [f.count async for f in aiter_frames(chunks(data))]

    assert asyncio.run(collect(body)) == [4, 4, 2]
    with pytest.raises(TruncatedStreamError):
        asyncio.run(collect(body[:-1]))


def test_empty_stream_with_only_an_end_frame() -> None:
    decoder = feed_all(encode_end(samples=0, frames=0, payload_bytes=0))
    assert decoder.close() == EndFrame(samples=0, frames=0, payload_bytes=0, meta={})


def test_empty_chunks_are_harmless() -> None:
    frames, body = make_stream()
    decoder = FrameDecoder()
    assert decoder.feed(b"") == []
    got = decoder.feed(body)
    assert decoder.feed(b"") == []
    assert len(got) == len(frames) and decoder.close().frames == 3


# --- truncation ----------------------------------------------------------------------------


def test_truncation_at_every_byte_is_detected() -> None:
    _, body = make_stream(OutputDtype.FLOAT16, Compression.ZSTD)
    for cut in range(len(body)):
        decoder = feed_all(body[:cut])
        with pytest.raises(TruncatedStreamError):
            decoder.close()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("inside_prefix", "inside a frame prefix"),
        ("inside_header", "inside a header"),
        ("inside_payload", "inside a frame payload"),
        ("missing_end", r"without an end frame after 3 frames \(10 samples\)"),
        ("inside_end", "inside a header"),
    ],
)
def test_truncation_messages(where: str, message: str) -> None:
    frames, body = make_stream()
    header, _ = split_frame(frames[1])
    second = len(frames[0])
    header_len = len(json.dumps(header))
    cut = {
        "inside_prefix": second + 6,
        "inside_header": second + 9 + header_len // 2,
        "inside_payload": second + len(frames[1]) - 3,
        "missing_end": len(body) - len(frames[-1]),
        "inside_end": len(body) - 2,
    }[where]
    with pytest.raises(TruncatedStreamError, match=message):
        feed_all(body[:cut]).close()


@pytest.mark.parametrize(
    ("totals", "message"),
    [
        ({"samples": 11, "frames": 3}, "samples=11"),
        ({"samples": 10, "frames": 4}, "frames=4"),
        ({"samples": 10, "frames": 3, "extra_bytes": 1}, "payload_bytes="),
    ],
)
def test_end_totals_must_match(totals: dict[str, int], message: str) -> None:
    frames, _ = make_stream()
    end_header, _ = split_frame(frames[-1])
    payload_bytes = end_header["totals"]["payload_bytes"] + totals.get("extra_bytes", 0)
    end = encode_end(
        samples=totals["samples"], frames=totals["frames"], payload_bytes=payload_bytes
    )
    body = b"".join(frames[:-1]) + end
    with pytest.raises(TruncatedStreamError, match=message):
        feed_all(body)


def test_a_lost_frame_is_caught_by_the_totals() -> None:
    frames, _ = make_stream()
    body = frames[0] + frames[2] + frames[3]  # the middle batch vanished
    with pytest.raises(TruncatedStreamError, match="do not match"):
        feed_all(body)


# --- corruption ----------------------------------------------------------------------------


def test_bad_magic_is_caught_at_the_first_wrong_byte() -> None:
    _, body = make_stream()
    decoder = FrameDecoder()
    decoder.feed(body[:2])
    with pytest.raises(CorruptFrameError, match="bad magic"):
        decoder.feed(b"X")
    with pytest.raises(CorruptFrameError, match="already failed"):
        decoder.feed(body[3:])
    with pytest.raises(TruncatedStreamError, match="failed earlier"):
        decoder.close()


def test_http_error_page_is_not_a_frame_stream() -> None:
    with pytest.raises(CorruptFrameError, match="is this a HAPI frame stream"):
        feed_all(b'{"detail": "not found", "code": "not_found"}')


def test_bad_version() -> None:
    frames, _ = make_stream()
    with pytest.raises(CorruptFrameError, match="unsupported frame format version 2"):
        feed_all(frames[0][:4] + b"\x02" + frames[0][5:])


@pytest.mark.parametrize(
    ("raw_header", "message"),
    [
        (b"{not json", "invalid frame header"),
        (b"\xff\xfe{}", "invalid frame header"),
        (b"[1, 2]", "invalid frame header"),
        (b'{"kind": "nope"}', "does not match any of the expected tags"),
        (b'{"kind": "end"}', "totals: Field required"),
        (b'{"kind": "error", "status": "500", "detail": "x"}', "status"),
        (b"x", "cannot be JSON"),
    ],
)
def test_corrupt_json_header(raw_header: bytes, message: str) -> None:
    with pytest.raises(CorruptFrameError, match=message):
        feed_all(raw_frame(raw_header))


def _mutated(mutate: Callable[[dict[str, Any]], None]) -> bytes:
    frames, _ = make_stream()
    header, payload = split_frame(frames[0])
    mutate(header)
    return raw_frame(header, payload)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda h: h["features"].update(dtype="float64"), "features.dtype"),
        (lambda h: h["features"].update(dtype="object"), "features.dtype"),
        (lambda h: h["labels"].update(dtype="int32"), "labels.dtype"),
        (lambda h: h["features"].update(codec="lz4"), "features.codec"),
        (lambda h: h["features"].update(nbytes=h["features"]["nbytes"] + 4), "features nbytes"),
        (lambda h: h["features"].update(shape=[4, 3, 5, 6]), "features nbytes"),
        (lambda h: h["features"].update(shape=[4, 3, 0, 25]), "greater than or equal to 1"),
        (lambda h: h["features"].update(shape=[4] + [1] * 8), "at most 8 items"),
        (lambda h: h["labels"].update(nbytes=31), "labels nbytes"),
        (lambda h: h.update(count=3), "count 3 disagrees"),
        (lambda h: h.update(offset=-1), "offset"),
        (lambda h: h.update(surprise=True), "Extra inputs are not permitted"),
        (lambda h: h["features"].update(crc32=2**32), "crc32"),
        (lambda h: h["features"].update(wire_nbytes=5), "wire_nbytes == nbytes"),
        (lambda h: h.update(meta=[1]), "meta"),
    ],
)
def test_schema_violations(mutate: Callable[[dict[str, Any]], None], message: str) -> None:
    with pytest.raises(CorruptFrameError, match=message):
        feed_all(_mutated(mutate))


@pytest.mark.parametrize("part", ["features", "labels"])
@pytest.mark.parametrize("compression", list(Compression))
def test_crc_mismatch(part: str, compression: Compression) -> None:
    frames, _ = make_stream(OutputDtype.FLOAT32, compression)
    header, payload = split_frame(frames[0])
    index = 5 if part == "features" else header["features"]["wire_nbytes"] + 3
    damaged = bytearray(payload)
    damaged[index] ^= 0x10
    with pytest.raises(CorruptFrameError, match=f"{part} crc32 mismatch at offset 0"):
        feed_all(raw_frame(header, bytes(damaged)))


def _zstd_frame(content: bytes, declared_nbytes: int, shape: list[int]) -> bytes:
    wire = zstandard.ZstdCompressor().compress(content)
    labels = struct.pack("<q", 0) * shape[0]
    header = {
        "kind": "batch",
        "offset": 0,
        "count": shape[0],
        "meta": {},
        "features": {
            "shape": shape,
            "dtype": "float32",
            "codec": "zstd",
            "nbytes": declared_nbytes,
            "wire_nbytes": len(wire),
            "crc32": zlib.crc32(wire),
        },
        "labels": {
            "shape": [shape[0]],
            "dtype": "int64",
            "nbytes": len(labels),
            "crc32": zlib.crc32(labels),
        },
    }
    return raw_frame(header, wire + labels)


def test_zstd_content_longer_than_declared_is_refused() -> None:
    # A checksum-valid frame whose zstd data inflates past nbytes: never decompress past it.
    frame = _zstd_frame(bytes(1 << 20), declared_nbytes=8, shape=[1, 2])
    with pytest.raises(CorruptFrameError, match="decompress to more than 8 bytes"):
        feed_all(frame)


def test_zstd_content_shorter_than_declared_is_refused() -> None:
    frame = _zstd_frame(bytes(4), declared_nbytes=8, shape=[1, 2])
    with pytest.raises(CorruptFrameError, match="decompress to 4 bytes, header says 8"):
        feed_all(frame)


def test_garbage_zstd_is_refused() -> None:
    frames, _ = make_stream(OutputDtype.FLOAT32, Compression.ZSTD)
    header, payload = split_frame(frames[0])
    n = header["features"]["wire_nbytes"]
    garbage = bytes(range(256)) * (n // 256 + 1)
    garbage = garbage[:n]
    header["features"]["crc32"] = zlib.crc32(garbage)
    with pytest.raises(CorruptFrameError, match="do not decompress"):
        feed_all(raw_frame(header, garbage + payload[n:]))


def test_data_after_end_frame() -> None:
    _, body = make_stream()
    decoder = FrameDecoder()
    decoder.feed(body)
    with pytest.raises(CorruptFrameError, match="1 bytes of data after the end frame"):
        decoder.feed(b"H")
    with pytest.raises(CorruptFrameError, match="after the end frame"):
        feed_all(body + body[:20])


# --- limits --------------------------------------------------------------------------------


def test_oversized_header_is_refused_from_the_prefix_alone() -> None:
    frames, _ = make_stream()
    decoder = FrameDecoder(max_header_bytes=64)
    with pytest.raises(OversizedHeaderError, match="exceeds the limit of 64 bytes") as info:
        decoder.feed(frames[0][:9])  # nothing of the header itself has arrived
    assert info.value.limit == 64 and info.value.length > 64


def test_header_claiming_4_gib_is_refused() -> None:
    with pytest.raises(OversizedHeaderError):
        feed_all(MAGIC + b"\x01" + b"\xff\xff\xff\xff")


@pytest.mark.parametrize("compression", list(Compression))
def test_oversized_payload_is_refused_before_buffering(compression: Compression) -> None:
    frames, _ = make_stream(OutputDtype.FLOAT32, compression)
    header, _ = split_frame(frames[0])
    header_end = 9 + len(json.dumps(header, separators=(",", ":")))
    decoder = FrameDecoder(max_payload_bytes=1000)  # raw features are 4*3*5*5*4 = 1200 bytes
    with pytest.raises(OversizedFrameError, match="exceeds the limit of 1000 bytes"):
        decoder.feed(frames[0][:header_end])


def test_limits_that_fit_are_fine() -> None:
    _, body = make_stream()
    decode_all(iter([body]), max_header_bytes=512, max_payload_bytes=1500)


# --- error frames --------------------------------------------------------------------------


def test_error_frame_raises_remote_stream_error() -> None:
    frames, _ = make_stream()
    decoder = FrameDecoder()
    assert len(decoder.feed(frames[0])) == 1
    with pytest.raises(RemoteStreamError, match="server error 507") as info:
        decoder.feed(encode_error(507, "GPU out of memory"))
    assert info.value.status == 507 and info.value.detail == "GPU out of memory"
    with pytest.raises(TruncatedStreamError):
        decoder.close()


def test_encoder_error_is_a_plain_error_frame() -> None:
    assert FrameEncoder.error(500, "boom") == encode_error(500, "boom")
    header, payload = split_frame(encode_error(500, "boom"))
    assert header == {"kind": "error", "status": 500, "detail": "boom"} and payload == b""


# --- encoder argument checks ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("features", "labels", "offset", "error", "message"),
    [
        (torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2), 0, TypeError, "floating"),
        (torch.zeros(2, 3), torch.zeros(3, dtype=torch.int64), 0, ValueError, "same number"),
        (torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), 0, ValueError, "same number"),
        (torch.zeros(2, 0), torch.zeros(2, dtype=torch.int64), 0, ValueError, "non-empty"),
        (torch.zeros(2, 3), torch.zeros(2, 1, dtype=torch.int64), 0, ValueError, "1-D integer"),
        (torch.zeros(2, 3), torch.zeros(2), 0, ValueError, "1-D integer"),
        (torch.zeros(()), torch.zeros(1, dtype=torch.int64), 0, ValueError, "1..8 dims"),
        (torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), -1, ValueError, "offset"),
        (torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), True, ValueError, "offset"),
    ],
)
def test_a_batch_with_bad_arguments_is_refused(
    features: torch.Tensor, labels: torch.Tensor, offset: int, error: type, message: str
) -> None:
    encoder = FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE)
    with pytest.raises(error, match=message):
        encoder.batch(features, labels, offset)


def test_meta_must_be_small_strict_json() -> None:
    args = (torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64), 0)
    encoder = FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE)
    with pytest.raises(ValueError, match="not strict JSON"):
        encoder.batch(*args, meta={"t": float("nan")})
    with pytest.raises(ValueError, match="not strict JSON"):
        encoder.batch(*args, meta={"t": object()})
    with pytest.raises(ValueError, match="shrink meta"):
        encoder.batch(*args, meta={"t": "x" * 70_000})
    with pytest.raises(ValueError, match="totals"):
        encode_end(samples=-1, frames=0, payload_bytes=0)
    with pytest.raises(ValueError, match="HTTP status"):
        encode_error(42, "no")


# --- throughput (printed, never asserted) --------------------------------------------------


def test_report_throughput(capsys: pytest.CaptureFixture[str]) -> None:
    feats = torch.relu(torch.randn(32, 256, 13, 13, generator=torch.Generator().manual_seed(0)))
    labels = torch.arange(32)
    megabytes = feats.numel() * 4 / 1e6
    lines = [f"frame throughput, 32x256x13x13 float32 features ({megabytes:.2f} MB):"]
    for dtype in OutputDtype:
        for compression in Compression:
            enc = FrameEncoder(dtype=dtype, compression=compression)
            start = time.perf_counter()
            for _ in range(5):
                frame = enc.batch(feats, labels, 0)
            encode_s = (time.perf_counter() - start) / 5
            start = time.perf_counter()
            for _ in range(5):
                decoder = FrameDecoder()
                for i in range(0, len(frame), 65536):
                    decoded = decoder.feed(frame[i : i + 65536])
            decode_s = (time.perf_counter() - start) / 5
            assert isinstance(decoded[0], BatchFrame)
            assert decoded[0].features.shape == feats.shape
            lines.append(
                f"  {dtype.value:8s} {compression.value:4s} wire {len(frame) / 1e6:5.2f} MB  "
                f"encode {megabytes / encode_s:6.0f} MB/s  decode {megabytes / decode_s:6.0f} MB/s"
            )
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_the_decoder_says_whether_its_input_ends_inside_a_frame() -> None:
    frames, _ = make_stream()
    dec = FrameDecoder()
    assert not dec.inside_frame
    for frame in frames:  # cut in its prefix, in its payload, before its last byte
        dec.feed(frame[:3])
        assert dec.inside_frame
        dec.feed(frame[3:-1])
        assert dec.inside_frame
        dec.feed(frame[-1:])
        assert not dec.inside_frame  # the next chunk begins a frame
