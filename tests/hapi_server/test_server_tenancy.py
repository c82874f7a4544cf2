"""Issue 27 on the HAPI server, over real HTTP: what a tenant holds is planned and given back.

* A client that sends ``/v1/extract`` and never reads its response is cut off after
  ``HAPI_SEND_TIMEOUT_S``: its planned memory and its slot come back, and the server serves
  others. The client's request is over a 600-sample shard whose features (about 29 MB at
  split 0) are far more than the server's frame queue and the sockets' buffers hold, so its
  stream stalls on the client's socket.
* ALL_IN_COS plans the shards' bytes before it reads them, as ``/v1/extract`` does: a
  fine-tune whose training does not fit the budget is refused (507) before a byte of its
  shards is read, and its shards' bytes are part of the memory the 507 names.

Ordering comes from the server's own ``/metrics``, polled with a deadline; nothing sleeps.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from hapi_stack import RunningStack

from .conftest import DATA, MODELS, SIDE, Dataset, ServerProcess, make_images, shard_bytes
from .server_helpers import TIMEOUT, assert_error, extract, metric, put_object, wait_for
from .test_server_queue import _numbers

pytestmark = pytest.mark.slow  # its own server

ARCH = "efficientnet_lite0"
BIG_SHARD = "tenancy/big-600.tar"
SMALL_SHARD = "shards/shard-000001.tar"  # 7 samples, from the session's dataset
SEND_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 60.0
RESERVE = 1 << 20
# Room for efficientnet_lite0's extractions (its load, a shard, a COS batch at 64 px), not for
# training resnet18 (three copies of its 45 MB of weights and its load).
BUDGET = RESERVE + 150 * (1 << 20)


@pytest.fixture(scope="module")
def big() -> bytes:
    return shard_bytes(*make_images(600, seed=41))


@pytest.fixture(scope="module")
def tenancy_server(
    server_factory: Callable[..., ServerProcess],
    swift_stack: RunningStack,
    dataset: Dataset,
    big: bytes,
) -> ServerProcess:
    put_object(swift_stack, BIG_SHARD, big)
    return server_factory(
        devices="cpu",
        cpu_memory_budget_bytes=BUDGET,
        count_process_memory=False,  # the plan's arithmetic alone, not the server's RSS
        framework_reserve_bytes=RESERVE,
        max_concurrent_per_device=1,  # one slot: the non-reader holds it until cut off
        send_timeout_s=SEND_TIMEOUT_S,
        request_timeout_s=120,
    )


@contextmanager
def unread_extract(
    server: ServerProcess, headers: dict[str, str], body: Any
) -> Iterator[socket.socket]:
    """POST /v1/extract on a raw socket whose response is never read (while the block runs)."""
    url = urlsplit(server.url)
    payload = json.dumps(body).encode()
    head = [
        "POST /v1/extract HTTP/1.1",
        f"Host: {url.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    sock = socket.create_connection((url.hostname, url.port), timeout=READ_TIMEOUT_S)
    with closing(sock):
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        yield sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sent before it closed the connection (bounded: each read waits at most READ_TIMEOUT_S)."""
    sock.settimeout(READ_TIMEOUT_S)
    received = bytearray()
    while chunk := sock.recv(1 << 20):
        received += chunk
    return bytes(received)


def planned(server: ServerProcess) -> float | None:
    return metric(server, "hapi_planned_memory_bytes", device="cpu")


def test_a_client_that_does_not_read_is_cut_off_and_frees_its_memory(
    tenancy_server: ServerProcess, dataset: Dataset
) -> None:
    server = tenancy_server
    body = dataset.request(ARCH, BIG_SHARD, 0, b_max=64)
    with unread_extract(server, dataset.headers(), body) as sock:
        wait_for(lambda: (planned(server) or 0) > 0, "the non-reader's request to be planned")
        started = time.monotonic()
        # Cut off after the send timeout: its memory, and the only slot, come back ...
        wait_for(
            lambda: planned(server) == 0 and metric(server, "hapi_queue_depth", device="cpu") == 0,
            "the non-reader's memory to be released",
            timeout=60,
        )
        assert time.monotonic() - started >= SEND_TIMEOUT_S
        # ... so another tenant is served while the non-reader's socket is still open.
        small = extract(server, dataset, dataset.request(ARCH, SMALL_SHARD, 0))
        assert len(small.labels) == 7
        # The server closed the connection: the client gets what was sent, then EOF, short
        # of the features (float32 inputs at split 0) it asked for.
        sent = read_to_end(sock)
        assert sent.startswith(b"HTTP/1.1 200")
        assert len(sent) < 600 * 3 * SIDE * SIDE * 4
    assert planned(server) == 0


def finetune_body(dataset: Dataset, shard: str) -> dict[str, Any]:
    obj, sha = dataset.weights["resnet18"]
    return {
        "container": DATA,
        "shards": [shard],
        "model": {
            "arch": "resnet18",
            "num_classes": 3,
            "weights": {"container": MODELS, "object": obj, "sha256": sha},
        },
        "freeze_index": 4,
        "transform": dataset.transform(),
        "batch_size": 4,
        "epochs": 1,
        "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9},
        "b_max": 4,
    }


def test_finetune_plans_its_shards_before_it_reads_them(
    tenancy_server: ServerProcess, dataset: Dataset, big: bytes
) -> None:
    server = tenancy_server
    small = len(shard_bytes(*make_images(7, seed=1)))
    read_before = metric(server, "hapi_swift_read_bytes_total") or 0.0
    needed = {}
    for shard in (SMALL_SHARD, BIG_SHARD):
        resp = httpx.post(
            f"{server.url}/v1/finetune",
            json=finetune_body(dataset, shard),
            headers=dataset.headers(),
            timeout=TIMEOUT,
        )
        err = assert_error(resp, 507, "insufficient_memory")
        needed[shard], _ = _numbers(err.detail)
    # Refused before anything was read: neither shard nor weights.
    assert metric(server, "hapi_swift_read_bytes_total") == read_before
    # The shard's bytes are in the plan (batch 4 of both: the rest is the same).
    assert needed[BIG_SHARD] - needed[SMALL_SHARD] == len(big) - small
