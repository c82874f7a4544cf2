"""Extraction throughput of the HAPI server on this machine: samples/s and MB/s of features.

For AlexNet and ResNet18 at 224 px, at an early split and at the freeze index, over
ImageNet-sized JPEGs (the ``photos`` source, 500x375, about 110 KB each):

* ``engine``: the server's compute path in-process (``hapi_core.engine.run_extraction``:
  decode + transform, head forward, frame encoding), one request, COS batch ``--batch``;
* ``http``: end to end through a real Swift all-in-one and a real ``hapi-server`` process on
  loopback, one ``POST /v1/extract`` per configuration, timed by the client from the request
  to the last byte (Swift reads, sha256, queueing and streaming included; weights are cached
  after the first request of an architecture, as in steady state, so each configuration runs
  once to warm up and is then timed).

Feature MB/s counts the float32 frames as sent (payload + headers).

    python benchmarks/extract_throughput.py                 # both modes, 200 samples
    python benchmarks/extract_throughput.py --no-http       # in-process only
    python benchmarks/extract_throughput.py --samples 50    # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import hapi_models
import httpx
import torch

from hapi_client.datasets import get_source
from hapi_contract import Compression, OutputDtype, write_shard
from hapi_contract.frames import FrameDecoder, FrameEncoder
from hapi_core.devices import Device
from hapi_core.engine import ExtractionJob, run_extraction

SIDE = 224
ARCHS = {"alexnet": (3, 17), "resnet18": (4, 11)}  # (early split, freeze index)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DATA, MODELS = "bench-throughput", "bench-models"


@dataclass
class Row:
    mode: str
    arch: str
    split: int
    samples: int
    seconds: float
    feature_bytes: int
    phases_s: dict[str, float] | None = None
    """engine mode: seconds spent decoding, computing and encoding."""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds

    @property
    def feature_mb_per_s(self) -> float:
        return self.feature_bytes / self.seconds / 1e6

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "arch": self.arch,
            "split": self.split,
            "samples": self.samples,
            "seconds": round(self.seconds, 4),
            "feature_bytes": self.feature_bytes,
            "samples_per_s": round(self.samples_per_s, 2),
            "feature_mb_per_s": round(self.feature_mb_per_s, 2),
            "phases_s": self.phases_s,
        }


def images(n: int) -> tuple[list[bytes], list[int]]:
    source = get_source(f"photos:train?per_class={-(-n // 10)}")
    samples = list(source)[:n]
    return [s.image for s in samples], [s.label for s in samples]


def engine_run(
    model: hapi_models.SplittableModel,
    split: int,
    imgs: list[bytes],
    labels: list[int],
    batch: int,
) -> tuple[float, int, dict[str, float]]:
    job = ExtractionJob(
        model=model,
        split=split,
        images=imgs,
        labels=labels,
        transform=hapi_models.InputTransform(resize=SIDE, crop=SIDE, mean=MEAN, std=STD),
        batch_size=batch,
        device=Device("cpu", 0),
        max_pixels=40_000_000,
        encoder=FrameEncoder(dtype=OutputDtype.FLOAT32, compression=Compression.NONE),
    )
    sent = 0

    def emit(frame: bytes) -> None:
        nonlocal sent
        sent += len(frame)

    start = time.perf_counter()
    stats = run_extraction(job, emit, threading.Event())
    phases = {"decode": stats.decode_s, "compute": stats.compute_s, "encode": stats.encode_s}
    return time.perf_counter() - start, sent, {k: round(v, 4) for k, v in phases.items()}


def run_engine(imgs: list[bytes], labels: list[int], batch: int) -> list[Row]:
    rows = []
    for arch, splits in ARCHS.items():
        torch.manual_seed(0)
        model = hapi_models.get_model(arch, num_classes=10).eval()
        for split in splits:
            engine_run(model, split, imgs[:batch], labels[:batch], batch)  # warm-up
            seconds, sent, phases = engine_run(model, split, imgs, labels, batch)
            rows.append(Row("engine", arch, split, len(imgs), seconds, sent, phases))
            report(rows[-1])
    return rows


@contextmanager
def stack_and_server(batch: int) -> Iterator[tuple[str, dict[str, str], object]]:
    """A Swift all-in-one and a HAPI server on free loopback ports; yields (url, headers, conn)."""
    from hapi_stack import StackConfig, down, up

    with tempfile.TemporaryDirectory(prefix="hapi-bench-") as tmp:
        config = StackConfig.on_free_ports(state_dir=Path(tmp) / "stack")
        stack = up(config)
        server: subprocess.Popen[bytes] | None = None
        try:
            port = config.hapi_port
            env = dict(os.environ)
            env.update(
                HAPI_HOST="127.0.0.1",
                HAPI_PORT=str(port),
                HAPI_SWIFT_URL=stack.proxy_url,
                HAPI_CPU_MEMORY_BUDGET_BYTES=str(16 * 2**30),
                HAPI_B_MIN=str(batch),
            )
            log = open(Path(tmp) / "hapi-server.log", "wb")  # noqa: SIM115
            server = subprocess.Popen(  # noqa: S603
                [sys.executable, "-m", "hapi_server", "--log-level", "warning"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("hapi-server did not start; see its log in " + tmp)
                time.sleep(0.2)
            conn = stack.connection()
            storage_url, token = conn.get_auth()
            yield url, {"X-Auth-Token": token, "X-Storage-Url": storage_url}, conn
            conn.close()
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
            down(config)


def run_http(imgs: list[bytes], labels: list[int], batch: int) -> list[Row]:
    rows = []
    with stack_and_server(batch) as (url, headers, conn):
        conn.put_container(DATA)  # type: ignore[attr-defined]
        conn.put_container(MODELS)  # type: ignore[attr-defined]
        shard = write_shard(
            (f"{i:09d}", img, "jpg", lab)
            for i, (img, lab) in enumerate(zip(imgs, labels, strict=True))
        )
        conn.put_object(DATA, "shard.tar", shard)  # type: ignore[attr-defined]
        for arch, splits in ARCHS.items():
            torch.manual_seed(0)
            blob = hapi_models.weights_to_bytes(hapi_models.get_model(arch, num_classes=10))
            conn.put_object(MODELS, f"{arch}.safetensors", blob)  # type: ignore[attr-defined]
            for split in splits:
                body = {
                    "container": DATA,
                    "shard": "shard.tar",
                    "model": {
                        "arch": arch,
                        "num_classes": 10,
                        "weights": {
                            "container": MODELS,
                            "object": f"{arch}.safetensors",
                            "sha256": hapi_models.sha256_hex(blob),
                        },
                    },
                    "split_index": split,
                    "b_max": batch,
                    "transform": {"resize": SIDE, "crop": SIDE, "mean": MEAN, "std": STD},
                }
                for _ in ("warm-up", "timed"):
                    decoder = FrameDecoder()
                    start = time.perf_counter()
                    with httpx.stream(
                        "POST", f"{url}/v1/extract", json=body, headers=headers, timeout=600
                    ) as resp:
                        resp.raise_for_status()
                        for chunk in resp.iter_raw():
                            decoder.feed(chunk)
                    seconds = time.perf_counter() - start
                    end = decoder.close()
                    assert end.samples == len(imgs)
                # The second run's numbers: weights cached, as in steady state.
                rows.append(Row("http", arch, split, len(imgs), seconds, decoder.bytes_received))
                report(rows[-1])
    return rows


def report(row: Row) -> None:
    phases = ""
    if row.phases_s:
        phases = " [" + ", ".join(f"{k} {v:.2f} s" for k, v in row.phases_s.items()) + "]"
    print(
        f"{row.mode:6s} {row.arch:9s} split {row.split:2d}: {row.samples_per_s:7.1f} samples/s "
        f"{row.feature_mb_per_s:8.1f} MB/s of features ({row.samples} in {row.seconds:.2f} s)"
        + phases,
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32, help="COS batch size (b_max)")
    parser.add_argument("--http", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=Path("bench-results/extract_throughput.json"))
    args = parser.parse_args(argv)

    imgs, labels = images(args.samples)
    print(
        f"{len(imgs)} JPEGs, {sum(map(len, imgs)) / len(imgs) / 1e3:.0f} kB mean, "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    rows = run_engine(imgs, labels, args.batch)
    if args.http:
        rows += run_http(imgs, labels, args.batch)

    print(f"\n{'mode':6s} {'arch':9s} {'split':>5s} {'samples/s':>10s} {'feature MB/s':>13s}")
    for r in rows:
        print(
            f"{r.mode:6s} {r.arch:9s} {r.split:5d} {r.samples_per_s:10.1f} {r.feature_mb_per_s:13.1f}"
        )
    meta = {
        "benchmark": "extract_throughput",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "side": SIDE,
        "batch": args.batch,
        "input": "photos:train JPEGs, 500x375",
        "dtype": "float32, no compression",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"meta": meta, "results": [r.as_dict() for r in rows]}, indent=2) + "\n"
    )
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
