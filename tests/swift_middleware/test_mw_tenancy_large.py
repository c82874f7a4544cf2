"""Issue 27's large cases on a real in-proxy proxy, at full size (opt-in: ``HAPI_LARGE_TENANCY=1``).

The proxy runs as the issue's did: ``execution = in_proxy``, ``memory_budget_bytes`` 2 GiB,
``framework_reserve_bytes`` 256 MiB, ``torch_threads`` 1, ``max_concurrent`` 2. The weights are
random (no pretrained ones exist here) but real safetensors objects in Swift, so their download
and load are part of what the proxy plans. The cases, one test each:

* ViT-L/16 at split 2 and at split 55 (224 px, 16 images);
* ConvNeXt-L at split 2 (224 px, 16 images);
* ViT-L/16 and ConvNeXt-L requested together;
* a folder dataset's part of 68 PNGs of about 14.5 MB each (1 GB, indexed in place by
  :func:`hapi_client.datasets.index_dataset`), read by two requests at once (ResNet18, 64 px);
* the livelock case, on a proxy with ``request_timeout`` 60 and 4 slots: a ViT-L/16 arrives
  while a cached ConvNeXt-L, pinned, streams a shard to a client that reads slowly, then a
  second user's small ResNet18 arrives. The small request must be served.

Each asserts that every answer is 200, 503, 504 or 507, that the proxy's sampled peak resident
memory (its idle memory included) stays within the budget plus 10 %, and that every plain GET
through the same proxy (one every 0.5 s) was answered; peak memory, the answers and the GETs'
p50/p99/max are printed (``-s``). No timing is asserted.

They upload about 4 GB and run ViT-L/16 on one thread, so they run only with
``HAPI_LARGE_TENANCY=1`` (docs/architecture.md, Development); otherwise every test is skipped
before any fixture uploads anything.
"""

from __future__ import annotations

import io
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import hapi_models
import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from hapi_client.datasets import index_dataset
from hapi_contract.errors import FrameError, RemoteStreamError
from hapi_contract.frames import BatchFrame, FrameDecoder
from hapi_stack import RunningStack
from tests.hapi_server.conftest import make_images, shard_bytes
from tests.swift_middleware.mw_support import (
    HAPI,
    MwData,
    ProxyProcess,
    imagenet_transform,
    shard_url,
)
from tests.swift_middleware.test_mw_in_proxy_waits import Markers, RssPeak
from tests.swift_middleware.test_mw_tenancy_budget import Bystander

ENABLED = os.environ.get("HAPI_LARGE_TENANCY") == "1"

pytestmark = [
    pytest.mark.swift,
    pytest.mark.slow,
    pytest.mark.skipif(
        not ENABLED,
        reason="issue 27's large cases upload about 4 GB and run ViT-L/16 on one thread: "
        "set HAPI_LARGE_TENANCY=1 to run them",
    ),
]

BUDGET = 2 << 30
RESERVE = 256 << 20
# The livelock case also runs at 3.5 GiB: at 2 GiB neither large model loads in the proxy (its
# weights plus their downloaded blob, beside the idle proxy's ~700 MiB), so nothing waits. At
# 3.5 GiB the ViT-L/16 fits an idle proxy but not beside the cached ConvNeXt-L.
LIVE_BUDGET = 7 << 29
CLEAN = {200, 503, 504, 507}
VIT, CONVNEXT, RESNET = "vit_l_16", "convnext_large", "resnet18"
SIDE = 224  # ViT-L/16's position embedding fixes it
IMAGES_224 = "shards/224-16.tar"
SLOW_SHARD = "shards/224-96.tar"  # the livelock case's pinned ConvNeXt-L streams it
SMALL_SHARD = "shards/64-12.tar"
PNG_COUNT, PNG_SIDE, PNG_VARIANTS = 68, 2200, 4  # 2200 x 2200 x 3 noise: 14.5 MB a PNG
ANSWER_TIMEOUT_S = 700  # beyond the default request_timeout (600 s): a 504 comes first
WAIT_S = 300  # the bound on this file's waits for another thread
UNCLEAN = -1  # no HTTP answer, or a stream that broke without an error frame


def _unique(tag: str) -> str:
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


def _put_weights(conn: Any, container: str, arch: str) -> Weights:
    torch.manual_seed(1)
    blob = hapi_models.weights_to_bytes(hapi_models.get_model(arch, num_classes=3))
    conn.put_object(container, f"{arch}.safetensors", blob)
    return Weights(container, f"{arch}.safetensors", hapi_models.sha256_hex(blob))


@pytest.fixture(scope="module")
def large(swift_stack: RunningStack) -> LargeData:
    """ViT-L/16 (1.2 GB of weights) and ConvNeXt-L (0.8 GB), random, and their 224 px shards."""
    container = _unique("models")
    conn = swift_stack.connection()
    conn.put_container(container)
    weights = {arch: _put_weights(conn, container, arch) for arch in (VIT, CONVNEXT)}
    conn.put_object(container, IMAGES_224, shard_bytes(*make_images(16, seed=71, side=SIDE)))
    conn.put_object(container, SLOW_SHARD, shard_bytes(*make_images(96, seed=72, side=SIDE)))
    conn.close()
    return LargeData(container, weights)


@dataclass(frozen=True)
class SecondUser:
    """A ResNet18 and a small shard that the other Swift user may read (a read ACL)."""

    data: LargeData
    token: str


@pytest.fixture(scope="module")
def second_user(swift_stack: RunningStack, mw_data: MwData) -> SecondUser:
    container = _unique("shared")
    conn = swift_stack.connection()
    conn.put_container(container, {"X-Container-Read": swift_stack.other_user})
    weights = {RESNET: _put_weights(conn, container, RESNET)}
    conn.put_object(container, SMALL_SHARD, shard_bytes(*make_images(12, seed=73, side=64)))
    conn.close()
    return SecondUser(LargeData(container, weights), mw_data.other_token)


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


@pytest.fixture(scope="module")
def png_folder(swift_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> PngFolder:
    """68 noise PNGs of 14.5 MB (``train/<class>/NNNN.png``, a few distinct images), indexed in
    place as one folder part."""
    index, data = _unique("png-index"), _unique("png-data")
    pngs = [_noise_png(seed) for seed in range(PNG_VARIANTS)]
    conn = swift_stack.connection()
    conn.put_container(data)
    conn.close()

    def put(i: int) -> None:
        one = swift_stack.connection()
        one.put_object(data, f"train/{'abc'[i % 3]}/{i:04d}.png", pngs[i % PNG_VARIANTS])
        one.close()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(put, range(PNG_COUNT)))
    conn = swift_stack.connection()
    manifest = index_dataset(
        conn,
        data,
        layout="folder",
        prefix="train",
        into=index,
        shard_size=PNG_COUNT,
        state_dir=tmp_path_factory.mktemp("png-index-state"),
        progress=False,
    )
    conn.close()
    (part,) = manifest.shards
    assert part.samples == PNG_COUNT
    return PngFolder(index, data, part.name, part.image_bytes or 0)


def _proxy_options(budget: int = BUDGET, **extra: str) -> dict[str, str]:
    return {
        "execution": "in_proxy",
        "torch_threads": "1",
        "max_concurrent": "2",
        "memory_budget_bytes": str(budget),
        "framework_reserve_bytes": str(RESERVE),
        "b_min": "1",
        **extra,
    }


@pytest.fixture(scope="module")
def large_proxy(proxy_factory: Callable[..., ProxyProcess]) -> ProxyProcess:
    """The issue's proxy (every other option at its in-proxy default: request_timeout 600)."""
    return proxy_factory(**_proxy_options())


@pytest.fixture(scope="module")
def markers() -> Iterator[Markers]:
    got = Markers()
    yield got
    got.sock.close()


@pytest.fixture(params=[BUDGET, LIVE_BUDGET], ids=["2GiB", "3.5GiB"])
def livelock_proxy(
    request: pytest.FixtureRequest,
    proxy_factory: Callable[..., ProxyProcess],
    markers: Markers,
) -> tuple[ProxyProcess, int]:
    """The livelock case's proxy and its budget: request_timeout 60, 4 slots, its debug log
    sent to :class:`Markers`; a send timeout long enough for the slow reader's pause."""
    proxy = proxy_factory(
        **_proxy_options(
            request.param,
            max_concurrent="4",
            request_timeout="60",
            send_timeout="300",
            log_udp_host="127.0.0.1",
            log_udp_port=str(markers.port),
        ),
        **{"set log_level": "DEBUG"},
    )
    return proxy, int(request.param)


@dataclass
class Answer:
    status: int
    seconds: float
    samples: int = 0
    detail: str = ""

    def __str__(self) -> str:
        what = f"{self.samples} samples" if self.status == 200 else self.detail[:500]
        return f"{self.status} after {self.seconds:.1f} s ({what})"


def _answer(
    url: str,
    body: dict[str, Any],
    token: str,
    *,
    started: threading.Event | None = None,
    resume: threading.Event | None = None,
) -> Answer:
    """POST a HAPI request and read its whole answer. With ``resume``, once the status line
    came (``started`` is set then), nothing is read until ``resume`` is set: the proxy's
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


class Watch:
    """A case's proxy memory (sampled every 20 ms) and a bystander's plain GETs."""

    def __init__(self, proxy: ProxyProcess, token: str, budget: int = BUDGET) -> None:
        self.budget = budget
        self.rss = RssPeak(proxy.process.pid)
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


def _together(jobs: list[tuple[str, dict[str, Any]]], token: str) -> list[Answer]:
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: _answer(job[0], job[1], token), jobs))


@pytest.mark.parametrize("split", [2, 55])
def test_vit_l16_stays_within_the_budget(
    large_proxy: ProxyProcess, large: LargeData, mw_data: MwData, split: int
) -> None:
    watch = Watch(large_proxy, mw_data.token)
    url = shard_url(large_proxy, large.container, IMAGES_224)
    got = _answer(url, large.body(VIT, split), mw_data.token)
    watch.check(f"ViT-L/16 split {split}", [got])


def test_convnext_l_stays_within_the_budget(
    large_proxy: ProxyProcess, large: LargeData, mw_data: MwData
) -> None:
    watch = Watch(large_proxy, mw_data.token)
    url = shard_url(large_proxy, large.container, IMAGES_224)
    got = _answer(url, large.body(CONVNEXT, 2), mw_data.token)
    watch.check("ConvNeXt-L split 2", [got])


def test_vit_l16_and_convnext_l_together_are_served_or_refused(
    large_proxy: ProxyProcess, large: LargeData, mw_data: MwData
) -> None:
    watch = Watch(large_proxy, mw_data.token)
    url = shard_url(large_proxy, large.container, IMAGES_224)
    got = _together([(url, large.body(VIT, 2)), (url, large.body(CONVNEXT, 2))], mw_data.token)
    watch.check("ViT-L/16 and ConvNeXt-L together", got)


def test_a_1gb_folder_part_read_twice_at_once_stays_within_the_budget(
    large_proxy: ProxyProcess, png_folder: PngFolder, mw_data: MwData
) -> None:
    body = mw_data.body("resnet18", 3, b_max=32)
    body.update(layout="folder", data_container=png_folder.data)
    url = shard_url(large_proxy, png_folder.index, png_folder.part)
    watch = Watch(large_proxy, mw_data.token)
    got = _together([(url, body)] * 2, mw_data.token)
    watch.check(
        f"a folder part of {PNG_COUNT} PNGs ({png_folder.part_bytes / 1e6:.0f} MB), 2 at once", got
    )


def test_a_small_request_of_another_user_is_served_while_large_ones_wait(
    livelock_proxy: tuple[ProxyProcess, int],
    markers: Markers,
    large: LargeData,
    second_user: SecondUser,
    mw_data: MwData,
) -> None:
    proxy, budget = livelock_proxy
    token = mw_data.token
    url_224 = shard_url(proxy, large.container, IMAGES_224)
    small_url = shard_url(proxy, second_user.data.container, SMALL_SHARD)
    small_body = second_user.data.body(RESNET, 3, side=64, b_max=4)
    # ConvNeXt-L cached (where it loads at all); the small request's time alone (its weights
    # cached too).
    warm = _answer(url_224, large.body(CONVNEXT, 2), token)
    alone = _answer(small_url, small_body, second_user.token)
    # ViT-L/16's first request profiles it on the meta device (seconds) before it queues: the
    # small request, sent after it, arrived first. Profiled now, over a shard that is not there
    # (404 once the profile and the weights' HEAD are done), it queues first below.
    missing = shard_url(proxy, large.container, "shards/missing.tar")
    assert _answer(missing, large.body(VIT, 2), token).status == 404
    print(
        f"\nlivelock case at {budget >> 20} MiB, before: ConvNeXt-L warm-up {warm}; "
        f"the small request alone {alone}"
    )
    assert warm.status in CLEAN and alone.status == 200, (str(warm), str(alone))

    watch = Watch(proxy, token, budget)
    seen = len(markers.drain())
    started, resume = threading.Event(), threading.Event()
    answers: dict[str, Answer] = {}

    def run(name: str, url: str, body: dict[str, Any], **kwargs: Any) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: answers.__setitem__(name, _answer(url, body, token, **kwargs))
        )
        thread.start()
        return thread

    slow_url = shard_url(proxy, large.container, SLOW_SHARD)
    pinned = run(
        "ConvNeXt-L, pinned",
        slow_url,
        large.body(CONVNEXT, 2, b_max=1),
        started=started,
        resume=resume,
    )
    try:
        assert started.wait(WAIT_S)
        vit = run("ViT-L/16", url_224, large.body(VIT, 2))
        markers.wait_for("took a slot", count=2, since=seen)
        small = _answer(small_url, small_body, second_user.token)
    finally:
        resume.set()
        pinned.join(WAIT_S)
    vit.join(WAIT_S)
    got = [answers["ConvNeXt-L, pinned"], answers["ViT-L/16"], small]
    watch.check("livelock case (ConvNeXt-L pinned; ViT-L/16; the second user's ResNet18)", got)
    assert small.status == 200 and small.samples == 12, str(small)
