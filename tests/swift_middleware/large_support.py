"""Issue 27's large cases, shared by both executions' opt-in files (``HAPI_LARGE_TENANCY=1``).

The in-proxy proxy's cases (``tests/swift_middleware/test_mw_tenancy_large.py``) and the HAPI
server's (``tests/hapi_server/test_server_tenancy_large.py``) upload the same data, send the
same requests and check them the same way: the settings of the issue's budget, the uploads
(random ViT-L/16, ConvNeXt-L and ResNet18 weights as safetensors, their shards, a 1 GB folder
part of noise PNGs), a request's whole answer, and :class:`Watch`, which samples one process's
resident memory while a bystander GETs through a proxy.
"""

from __future__ import annotations

import io
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hapi_models
import httpx
import numpy as np
import torch
from PIL import Image

from hapi_client.datasets import index_dataset
from hapi_contract import write_shard
from hapi_contract.errors import FrameError, RemoteStreamError
from hapi_contract.frames import BatchFrame, FrameDecoder
from hapi_stack import RunningStack
from tests.hapi_server.conftest import make_images, shard_bytes
from tests.swift_middleware.mw_support import HAPI, ProxyProcess, imagenet_transform
from tests.swift_middleware.test_mw_in_proxy_waits import RssPeak
from tests.swift_middleware.test_mw_tenancy_budget import Bystander

BUDGET = 2 << 30
RESERVE = 256 << 20
# The livelock case also runs at 3.5 GiB: at 2 GiB neither large model loads (its weights plus
# their downloaded blob, beside the idle process's memory), so nothing waits. At 3.5 GiB the
# ViT-L/16 fits an idle process but not beside the cached ConvNeXt-L.
LIVE_BUDGET = 7 << 29
CLEAN = {200, 503, 504, 507}
VIT, CONVNEXT, RESNET = "vit_l_16", "convnext_large", "resnet18"
SIDE = 224  # ViT-L/16's position embedding fixes it
IMAGES_224 = "shards/224-16.tar"
SLOW_SHARD = "shards/224-96.tar"  # the livelock case's pinned ConvNeXt-L streams it
SMALL_SHARD = "shards/64-12.tar"
PNG_COUNT, PNG_SIDE, PNG_VARIANTS = 68, 2200, 4  # 2200 x 2200 x 3 noise: 14.5 MB a PNG
PNG_SHARD = "shards/png-68.tar"  # the same PNGs as one shard: 988 MB
ANSWER_TIMEOUT_S = 700  # beyond the default request_timeout (600 s): a 504 comes first
WAIT_S = 300  # the bound on these cases' waits for another thread
UNCLEAN = -1  # no HTTP answer, or a stream that broke without an error frame


def unique(tag: str) -> str:
    return f"mw-large-{tag}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Weights:
    container: str
    obj: str
    sha256: str

    def ref(self, arch: str) -> dict[str, Any]:
        return {
            "arch": arch,
            "num_classes": 3,
            "weights": {"container": self.container, "object": self.obj, "sha256": self.sha256},
        }


@dataclass(frozen=True)
class LargeData:
    """The large models and their shards, in one container of the test user."""

    container: str
    weights: dict[str, Weights]

    def body(self, arch: str, split: int, *, side: int = SIDE, b_max: int = 8) -> dict[str, Any]:
        return {
            "model": self.weights[arch].ref(arch),
            "split_index": split,
            "transform": imagenet_transform(side),
            "b_max": b_max,
        }


def put_weights(conn: Any, container: str, arch: str) -> Weights:
    torch.manual_seed(1)
    blob = hapi_models.weights_to_bytes(hapi_models.get_model(arch, num_classes=3))
    conn.put_object(container, f"{arch}.safetensors", blob)
    return Weights(container, f"{arch}.safetensors", hapi_models.sha256_hex(blob))


def upload_large(stack: RunningStack) -> LargeData:
    """ViT-L/16 (1.2 GB of weights) and ConvNeXt-L (0.8 GB), random, and their 224 px shards."""
    container = unique("models")
    conn = stack.connection()
    conn.put_container(container)
    weights = {arch: put_weights(conn, container, arch) for arch in (VIT, CONVNEXT)}
    conn.put_object(container, IMAGES_224, shard_bytes(*make_images(16, seed=71, side=SIDE)))
    conn.put_object(container, SLOW_SHARD, shard_bytes(*make_images(96, seed=72, side=SIDE)))
    conn.close()
    return LargeData(container, weights)


@dataclass(frozen=True)
class SecondUser:
    """A ResNet18 and a small shard that the other Swift user may read (a read ACL)."""

    data: LargeData
    token: str


def upload_second_user(stack: RunningStack, other_token: str) -> SecondUser:
    container = unique("shared")
    conn = stack.connection()
    conn.put_container(container, {"X-Container-Read": stack.other_user})
    weights = {RESNET: put_weights(conn, container, RESNET)}
    conn.put_object(container, SMALL_SHARD, shard_bytes(*make_images(12, seed=73, side=64)))
    conn.close()
    return SecondUser(LargeData(container, weights), other_token)


def _noise_png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (PNG_SIDE, PNG_SIDE, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


@dataclass(frozen=True)
class PngFolder:
    index: str
    data: str
    part: str
    part_bytes: int


def upload_png_folder(stack: RunningStack, state_dir: Path) -> PngFolder:
    """68 noise PNGs of 14.5 MB (``train/<class>/NNNN.png``, a few distinct images), indexed in
    place as one folder part (``state_dir`` holds the indexer's state)."""
    index, data = unique("png-index"), unique("png-data")
    pngs = [_noise_png(seed) for seed in range(PNG_VARIANTS)]
    conn = stack.connection()
    conn.put_container(data)
    conn.close()

    def put(i: int) -> None:
        one = stack.connection()
        one.put_object(data, f"train/{'abc'[i % 3]}/{i:04d}.png", pngs[i % PNG_VARIANTS])
        one.close()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(put, range(PNG_COUNT)))
    conn = stack.connection()
    manifest = index_dataset(
        conn,
        data,
        layout="folder",
        prefix="train",
        into=index,
        shard_size=PNG_COUNT,
        state_dir=state_dir,
        progress=False,
    )
    conn.close()
    (part,) = manifest.shards
    assert part.samples == PNG_COUNT
    return PngFolder(index, data, part.name, part.image_bytes or 0)


def upload_png_shard(stack: RunningStack, container: str) -> int:
    """The folder part's noise PNGs again, as one shard tar of 68 samples (988 MB, the issue's
    "988 MB shard" row) at :data:`PNG_SHARD` in ``container``; its size in bytes."""
    pngs = [_noise_png(seed) for seed in range(PNG_VARIANTS)]
    data = write_shard((f"{i:06d}", pngs[i % PNG_VARIANTS], "png", i % 3) for i in range(PNG_COUNT))
    conn = stack.connection()
    conn.put_object(container, PNG_SHARD, data)
    conn.close()
    return len(data)


@dataclass
class Answer:
    status: int
    seconds: float
    samples: int = 0
    detail: str = ""

    def __str__(self) -> str:
        what = f"{self.samples} samples" if self.status == 200 else self.detail[:500]
        return f"{self.status} after {self.seconds:.1f} s ({what})"


def answer(
    url: str,
    body: dict[str, Any],
    token: str,
    *,
    started: threading.Event | None = None,
    resume: threading.Event | None = None,
) -> Answer:
    """POST a HAPI request and read its whole answer. With ``resume``, once the status line
    came (``started`` is set then), nothing is read until ``resume`` is set: the server's
    writes block once the sockets' buffers are full."""
    start = time.perf_counter()
    headers = {**HAPI, "X-Auth-Token": token}
    try:
        with httpx.stream(
            "POST", url, json=body, headers=headers, timeout=ANSWER_TIMEOUT_S
        ) as resp:
            if started is not None:
                started.set()
            if resp.status_code != 200:
                detail = resp.read().decode(errors="replace")
                return Answer(resp.status_code, time.perf_counter() - start, detail=detail)
            if resume is not None:
                resume.wait(WAIT_S)
            decoder, samples = FrameDecoder(), 0
            for chunk in resp.iter_bytes():
                for frame in decoder.feed(chunk):
                    if isinstance(frame, BatchFrame):
                        samples += len(frame.labels)
            decoder.close()
            return Answer(200, time.perf_counter() - start, samples)
    except RemoteStreamError as exc:
        return Answer(exc.status, time.perf_counter() - start, detail=f"in stream: {exc.detail}")
    except (httpx.HTTPError, FrameError) as exc:
        return Answer(UNCLEAN, time.perf_counter() - start, detail=repr(exc))
    finally:
        if started is not None:
            started.set()


def together(jobs: list[tuple[str, dict[str, Any]]], token: str) -> list[Answer]:
    """Send every ``(url, body)`` at once; their answers in order."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: answer(job[0], job[1], token), jobs))


class Watch:
    """A case's memory (one process's, sampled every 20 ms) and a bystander's plain GETs
    through ``proxy``. The memory is the proxy's own unless ``memory_of`` names another
    process (the HAPI server behind a decoupled proxy)."""

    def __init__(
        self,
        proxy: ProxyProcess,
        token: str,
        budget: int = BUDGET,
        *,
        memory_of: int | None = None,
    ) -> None:
        self.budget = budget
        self.rss = RssPeak(memory_of if memory_of is not None else proxy.process.pid)
        self.bystander = Bystander(proxy, token)

    def check(self, case: str, answers: list[Answer]) -> None:
        """Print the case's figures, then assert the issue's goal."""
        self.rss.stop()
        gets = self.bystander.stop()
        rss, bound = self.rss, self.budget * 1.10
        after = rss._rss()  # noqa: SLF001 - the sampler's own reading, once more
        print(
            f"\n{case}: {'; '.join(map(str, answers))}\n  peak RSS {rss.peak >> 20} MiB "
            f"(before {rss.before >> 20} MiB, +{(rss.peak - rss.before) >> 20}, after "
            f"{after >> 20} MiB), budget "
            f"{self.budget >> 20} MiB, bound {int(bound) >> 20} MiB; {gets}"
        )
        assert {a.status for a in answers} <= CLEAN, [str(a) for a in answers]
        assert self.bystander.failures == 0, f"plain GETs through the proxy failed: {gets}"
        assert rss.peak <= bound, f"peak RSS {rss.peak >> 20} MiB over the budget + 10 %"
