"""Issue 27's large cases on a real HAPI server, at full size (opt-in: ``HAPI_LARGE_TENANCY=1``).

The decoupled execution: a Swift proxy whose ``hapi`` filter forwards HAPI requests to a real
``python -m hapi_server`` process, which reads the shards and weights from the session stack's
Swift as the caller. The server runs with the issue's budget: ``devices`` cpu,
``cpu_memory_budget_bytes`` 2 GiB, ``framework_reserve_bytes`` 256 MiB, ``torch_threads`` 1,
``max_concurrent_per_device`` 2, ``b_min`` 1 (every other setting at its default, the feature
store off as in the other server tests, so that two identical requests both run). The data,
requests and checks are the in-proxy file's (:mod:`tests.swift_middleware.large_support`):

* ViT-L/16 at split 2 and at split 55 (224 px, 16 images);
* ConvNeXt-L at split 2 (224 px, 16 images);
* ViT-L/16 and ConvNeXt-L requested together;
* a folder dataset's part of 68 PNGs of about 14.5 MB each (1 GB), read by two requests at once
  (ResNet18, 64 px);
* the same PNGs as one 988 MB shard tar, read by two requests at once (ResNet18, 64 px);
* the livelock case, on a server with ``request_timeout_s`` 60 and 4 slots (at 2 GiB and at
  3.5 GiB): a ViT-L/16 arrives while a cached ConvNeXt-L, pinned, streams a shard to a client
  that reads slowly, then a second user's small ResNet18 arrives. The small request must be
  served.

Each asserts that every answer is 200, 503, 504 or 507, that the server's sampled peak resident
memory (its idle memory included) stays within the budget plus 10 %, and that every plain GET
through the same proxy (one every 0.5 s) was answered; peak memory, the answers and the GETs'
p50/p99/max are printed (``-s``). No timing is asserted.

They upload about 5 GB and run ViT-L/16 on one thread, so they run only with
``HAPI_LARGE_TENANCY=1`` (docs/architecture.md, Development); otherwise every test is skipped
before any fixture uploads anything.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hapi_stack import OTHER_USER, RunningStack
from tests.hapi_server.conftest import ServerProcess, make_images, shard_bytes, start_server
from tests.hapi_server.server_helpers import metric, wait_for
from tests.swift_middleware.large_support import (
    BUDGET,
    CLEAN,
    CONVNEXT,
    IMAGES_224,
    LIVE_BUDGET,
    PNG_COUNT,
    PNG_SHARD,
    RESERVE,
    RESNET,
    SLOW_SHARD,
    SMALL_SHARD,
    VIT,
    WAIT_S,
    Answer,
    LargeData,
    PngFolder,
    SecondUser,
    Watch,
    answer,
    together,
    upload_large,
    upload_png_folder,
    upload_png_shard,
    upload_second_user,
)
from tests.swift_middleware.mw_support import (
    IMAGE_SIDE,
    MW_DATA,
    SHARD,
    SHARD_META,
    ProxyProcess,
    shard_url,
    start_proxy,
)

ENABLED = os.environ.get("HAPI_LARGE_TENANCY") == "1"

pytestmark = [
    pytest.mark.swift,
    pytest.mark.slow,
    pytest.mark.skipif(
        not ENABLED,
        reason="issue 27's large cases upload about 5 GB and run ViT-L/16 on one thread: "
        "set HAPI_LARGE_TENANCY=1 to run them",
    ),
]


@dataclass(frozen=True)
class Tokens:
    own: str
    other: str


@pytest.fixture(scope="module")
def tokens(swift_stack: RunningStack) -> Tokens:
    """The test user's token and the other user's, and the object the bystander GETs (the
    filter tests' own shard, put with the same bytes as their ``mw_data``)."""
    conn = swift_stack.connection()
    conn.put_container(MW_DATA)
    images = shard_bytes(*make_images(12, seed=11, side=IMAGE_SIDE))
    conn.put_object(MW_DATA, SHARD, images, headers=SHARD_META)
    _, own = conn.get_auth()
    conn.close()
    other = swift_stack.connection(OTHER_USER.name, OTHER_USER.key)
    _, other_token = other.get_auth()
    other.close()
    return Tokens(own, other_token)


@pytest.fixture(scope="module")
def large(swift_stack: RunningStack) -> LargeData:
    return upload_large(swift_stack)


@pytest.fixture(scope="module")
def second_user(swift_stack: RunningStack, tokens: Tokens) -> SecondUser:
    return upload_second_user(swift_stack, tokens.other)


@pytest.fixture(scope="module")
def png_folder(swift_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> PngFolder:
    return upload_png_folder(swift_stack, tmp_path_factory.mktemp("png-index-state"))


@dataclass(frozen=True)
class Decoupled:
    """A HAPI server with a budget, the proxy that forwards to it, and the budget."""

    server: ServerProcess
    proxy: ProxyProcess
    budget: int

    def watch(self, token: str) -> Watch:
        """The server's memory and a bystander's GETs through the proxy."""
        return Watch(self.proxy, token, self.budget, memory_of=self.server.process.pid)


@pytest.fixture(scope="module")
def png_shard(swift_stack: RunningStack, second_user: SecondUser) -> int:
    return upload_png_shard(swift_stack, second_user.data.container)


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hapi-large-tenancy")


def _decoupled(
    stack: RunningStack, work_dir: Path, budget: int, **settings: Any
) -> Iterator[Decoupled]:
    """Start the server and its proxy; stop both (by PID) when the case is done."""
    server = start_server(
        stack,
        work_dir,
        devices="cpu",
        cpu_memory_budget_bytes=budget,
        framework_reserve_bytes=RESERVE,
        torch_threads=1,
        b_min=1,
        **{"max_concurrent_per_device": 2, **settings},
    )
    try:
        options = {"hapi_servers": server.url, "swift_url": stack.proxy_url}
        proxy = start_proxy(stack, work_dir, options)
        try:
            yield Decoupled(server, proxy, budget)
        finally:
            proxy.stop()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def decoupled(swift_stack: RunningStack, work_dir: Path) -> Iterator[Decoupled]:
    """The issue's server (every other setting at its default: request_timeout_s 600)."""
    yield from _decoupled(swift_stack, work_dir, BUDGET)


# Measured on the 2-core EPYC (the figures of the first run): the small request is deferred
# behind the ViT-L/16 that does not fit beside the pinned ConvNeXt-L, and is served only once
# the proxy cuts the pinned reader off; the ViT-L/16's load then takes the server over the bound.
@pytest.fixture(params=[BUDGET, LIVE_BUDGET], ids=["2GiB", "3.5GiB"])
def livelock(
    request: pytest.FixtureRequest, swift_stack: RunningStack, work_dir: Path
) -> Iterator[Decoupled]:
    """The livelock case's server: request_timeout_s 60, 4 slots, a send timeout long enough
    for the slow reader's pause."""
    yield from _decoupled(
        swift_stack,
        work_dir,
        int(request.param),
        request_timeout_s=60,
        max_concurrent_per_device=4,
        send_timeout_s=300,
    )


@pytest.mark.parametrize("split", [2, 55])
def test_vit_l16_stays_within_the_budget(
    decoupled: Decoupled, large: LargeData, tokens: Tokens, split: int
) -> None:
    watch = decoupled.watch(tokens.own)
    url = shard_url(decoupled.proxy, large.container, IMAGES_224)
    got = answer(url, large.body(VIT, split), tokens.own)
    watch.check(f"server: ViT-L/16 split {split}", [got])


def test_convnext_l_stays_within_the_budget(
    decoupled: Decoupled, large: LargeData, tokens: Tokens
) -> None:
    watch = decoupled.watch(tokens.own)
    url = shard_url(decoupled.proxy, large.container, IMAGES_224)
    got = answer(url, large.body(CONVNEXT, 2), tokens.own)
    watch.check("server: ConvNeXt-L split 2", [got])


def test_vit_l16_and_convnext_l_together_are_served_or_refused(
    decoupled: Decoupled, large: LargeData, tokens: Tokens
) -> None:
    watch = decoupled.watch(tokens.own)
    url = shard_url(decoupled.proxy, large.container, IMAGES_224)
    got = together([(url, large.body(VIT, 2)), (url, large.body(CONVNEXT, 2))], tokens.own)
    watch.check("server: ViT-L/16 and ConvNeXt-L together", got)


def test_a_1gb_folder_part_read_twice_at_once_stays_within_the_budget(
    decoupled: Decoupled, png_folder: PngFolder, second_user: SecondUser, tokens: Tokens
) -> None:
    # The second user's ResNet18 (the owner reads it too): the in-proxy file's weights.
    body = second_user.data.body(RESNET, 3, side=IMAGE_SIDE, b_max=32)
    body.update(layout="folder", data_container=png_folder.data)
    url = shard_url(decoupled.proxy, png_folder.index, png_folder.part)
    watch = decoupled.watch(tokens.own)
    got = together([(url, body)] * 2, tokens.own)
    watch.check(
        f"server: a folder part of {PNG_COUNT} PNGs ({png_folder.part_bytes / 1e6:.0f} MB), "
        "2 at once",
        got,
    )


def test_a_1gb_shard_read_twice_at_once_stays_within_the_budget(
    decoupled: Decoupled, png_shard: int, second_user: SecondUser, tokens: Tokens
) -> None:
    body = second_user.data.body(RESNET, 3, side=IMAGE_SIDE, b_max=32)
    url = shard_url(decoupled.proxy, second_user.data.container, PNG_SHARD)
    watch = decoupled.watch(tokens.own)
    got = together([(url, body)] * 2, tokens.own)
    watch.check(f"server: a shard of {PNG_COUNT} PNGs ({png_shard / 1e6:.0f} MB), 2 at once", got)


def _waiting_or_admitted(server: ServerProcess, planned_before: float) -> bool:
    """A request queued for memory, or more memory planned than before it came."""
    queued = metric(server, "hapi_queue_depth", device="cpu") or 0.0
    planned = metric(server, "hapi_planned_memory_bytes", device="cpu") or 0.0
    return queued >= 1 or planned > planned_before


def test_a_small_request_of_another_user_is_served_while_large_ones_wait(
    livelock: Decoupled, large: LargeData, second_user: SecondUser, tokens: Tokens
) -> None:
    server, proxy, budget = livelock.server, livelock.proxy, livelock.budget
    token = tokens.own
    url_224 = shard_url(proxy, large.container, IMAGES_224)
    small_url = shard_url(proxy, second_user.data.container, SMALL_SHARD)
    small_body = second_user.data.body(RESNET, 3, side=64, b_max=4)
    # ConvNeXt-L cached (where it loads at all); the small request's time alone (its weights
    # cached too).
    warm = answer(url_224, large.body(CONVNEXT, 2), token)
    alone = answer(small_url, small_body, second_user.token)
    print(
        f"\nserver livelock case at {budget >> 20} MiB, before: ConvNeXt-L warm-up {warm}; "
        f"the small request alone {alone}"
    )
    assert warm.status in CLEAN and alone.status == 200, (str(warm), str(alone))

    watch = livelock.watch(token)
    started, resume = threading.Event(), threading.Event()
    answers: dict[str, Answer] = {}

    def run(name: str, url: str, body: dict[str, Any], **kwargs: Any) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: answers.__setitem__(name, answer(url, body, token, **kwargs))
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
        planned_before = metric(server, "hapi_planned_memory_bytes", device="cpu") or 0.0
        vit = run("ViT-L/16", url_224, large.body(VIT, 2))
        # The small request comes after the ViT-L/16 is in the scheduler (queued for memory,
        # admitted) or already answered (a 507 where it can never fit).
        wait_for(
            lambda: "ViT-L/16" in answers or _waiting_or_admitted(server, planned_before),
            "the ViT-L/16 to be queued, admitted or answered",
            timeout=WAIT_S,
        )
        small = answer(small_url, small_body, second_user.token)
    finally:
        resume.set()
        pinned.join(WAIT_S)
    vit.join(WAIT_S)
    got = [answers["ConvNeXt-L, pinned"], answers["ViT-L/16"], small]
    watch.check(
        "server livelock case (ConvNeXt-L pinned; ViT-L/16; the second user's ResNet18)", got
    )
    assert small.status == 200 and small.samples == 12, str(small)
