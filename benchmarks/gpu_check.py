"""Images/s per stage and end to end of the extraction engine on one GPU (issue 30).

Run by ``scripts/gpu_check.sh`` on a machine with CUDA; in-process, no Swift: the stages are
the CPU fast decode on one thread (and the previous PIL path), nvJPEG's batched decode, the
head's forward at the COS batch (contiguous and channels_last) and the engine's whole request
(``run_extraction`` with the host's decode pool and layout choice) over 500x375 photos::

    python -m hapi_bench.gpu_check [--images 512] [--batch 128]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable

import hapi_models
import torch
from hapi_models.layout import LayoutChooser

from hapi_client.datasets import get_source
from hapi_contract import Compression, OutputDtype
from hapi_contract.frames import FrameEncoder
from hapi_core.decode_pool import DecodePool, available_cores, split_threads
from hapi_core.devices import Device
from hapi_core.engine import ExtractionJob, run_extraction

from .data import photos_spec

__all__ = ["main"]

HEADS = (("resnet18", 8), ("efficientnet_lite0", 9))  # ResNet18 to layer2; the demo's head


def _rate(fn: Callable[[], object], items: int, sync: bool = False) -> float:
    fn()
    if sync:
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if sync:
        torch.cuda.synchronize()
    return items / (time.perf_counter() - started)


def _check_head(arch: str, split: int, images: list[bytes], batch: int, cuda: torch.device) -> None:
    small = images[:64]
    transform = hapi_models.get_spec(arch).transform
    torch.set_num_threads(1)
    fast = _rate(lambda: transform.decode_batch(small), len(small))
    pil = _rate(lambda: transform.decode_batch(small, path="pil"), len(small))
    gpu = _rate(lambda: transform.decode_batch_cuda(images, cuda), len(images), sync=True)
    print(
        f"[{arch}:{split}] decode: CPU fast {fast:.0f}/s per core, CPU PIL {pil:.0f}/s per "
        f"core, nvJPEG batched {gpu:.0f}/s",
        flush=True,
    )
    head = hapi_models.get_model(arch, num_classes=10).eval().head(split).to(cuda)
    x = transform.decode_batch_cuda(images[:batch], cuda)
    with torch.inference_mode():
        plain = _rate(lambda: head(x), len(x), sync=True)
        last_x = x.contiguous(memory_format=torch.channels_last)
        last = _rate(lambda: head(last_x), len(x), sync=True)
        torch.testing.assert_close(head(last_x), head(x), rtol=1e-3, atol=1e-3)
    print(
        f"[{arch}:{split}] head at batch {len(x)}: {plain:.0f}/s contiguous, "
        f"{last:.0f}/s channels_last",
        flush=True,
    )
    decode_threads, torch_threads = split_threads(available_cores(), None, None)
    torch.set_num_threads(torch_threads)
    pool = DecodePool(decode_threads)
    model = hapi_models.get_model(arch, num_classes=10).eval().to(cuda)
    for path in ("fast", "pil"):
        job = ExtractionJob(
            model=model,
            split=split,
            images=images,
            labels=[0] * len(images),
            transform=transform,
            batch_size=batch,
            device=Device("cuda:0", torch.cuda.get_device_properties(0).total_memory),
            max_pixels=10**8,
            encoder=FrameEncoder(dtype=OutputDtype.FLOAT16, compression=Compression.NONE),
            decode_pool=pool if path == "fast" else DecodePool(0),
            decode_path=path,
            layouts=LayoutChooser(path == "fast"),
        )
        run_extraction(job, lambda frame: None, threading.Event())  # warm: the layout
        job.encoder = FrameEncoder(dtype=OutputDtype.FLOAT16, compression=Compression.NONE)
        started = time.perf_counter()
        run_extraction(job, lambda frame: None, threading.Event())
        rate = len(images) / (time.perf_counter() - started)
        print(
            f"[{arch}:{split}] end to end ({path} path, {decode_threads} decode threads): "
            f"{rate:.0f} images/s",
            flush=True,
        )
    pool.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing measured")
        return 2
    cuda = torch.device("cuda")
    images = [s.image for s in get_source(photos_spec("train", max(1, args.images // 10)))]
    images = images[: args.images]
    print(
        f"gpu_check: {torch.cuda.get_device_name()}, {available_cores()} cores, "
        f"{len(images)} photos of 500x375, torch {torch.__version__}",
        flush=True,
    )
    for arch, split in HEADS:
        _check_head(arch, split, images, args.batch, cuda)
    print(f"gpu_check: done (pid {os.getpid()})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
