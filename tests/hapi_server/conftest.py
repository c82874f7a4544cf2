"""Fixtures of the server tests: real uvicorn processes next to the session's real Swift.

Each server runs as its own process (``python -m hapi_server``) on a free port, over real HTTP,
and is stopped by its PID at the end of the session.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hapi_models
import numpy as np
import pytest
import torch
from PIL import Image
from swiftclient.client import Connection

from hapi_contract import write_shard
from hapi_stack import RunningStack
from tests.readiness import ready

DATA = "hapi-test-data"
MODELS = "hapi-test-models"
SIDE = 64  # small images keep the CPU tests fast; the code path is the same at 224


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def start_server(
    stack: RunningStack,
    log_dir: Path,
    preexec: Callable[[], None] | None = None,
    port: int | None = None,
    ready_status: int = 200,
    **settings: object,
) -> ServerProcess:
    port = port or free_port()
    env = dict(os.environ)
    env.update(
        HAPI_HOST="127.0.0.1",
        HAPI_PORT=str(port),
        HAPI_SWIFT_URL=stack.proxy_url,
        HAPI_TORCH_THREADS="1",
        HAPI_ADAPTATION_WINDOW_S="0.01",
    )
    # The feature store (on by default since issue 32) would answer a repeat of another test's
    # request without running it, and these tests check the request's own computation: its
    # planned COS batch, its stages, its memory. The sharing tests ask for a store.
    settings = {"feature_store_bytes": 0, **settings}
    env.update({f"HAPI_{k.upper()}": str(v) for k, v in settings.items()})
    log = log_dir / f"hapi-server-{port}.log"
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "hapi_server", "--log-level", "info"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        preexec_fn=preexec,  # noqa: PLW1509
    )
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log)
    # ready_status=503: the ready answer of a server whose Swift is down on purpose.
    return ready(server, proc, "/healthz", timeout=120, status=ready_status)


@pytest.fixture(scope="session")
def server_factory(
    swift_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []
    log_dir = tmp_path_factory.mktemp("hapi-server-logs")

    def factory(
        preexec: Callable[[], None] | None = None, ready_status: int = 200, **settings: Any
    ) -> ServerProcess:
        server = start_server(swift_stack, log_dir, preexec, ready_status=ready_status, **settings)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def hapi_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory(cpu_memory_budget_bytes=3 * 2**30, b_min=4)


def make_images(n: int, seed: int, side: int = SIDE) -> tuple[list[bytes], list[int]]:
    """Random coloured JPEGs of varied sizes with labels (real encoded images, real decode)."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(n):
        h, w = int(rng.integers(side, side + 40)), int(rng.integers(side, side + 40))
        arr = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=85)
        images.append(buf.getvalue())
        labels.append(i % 3)
    return images, labels


def shard_bytes(images: list[bytes], labels: list[int]) -> bytes:
    return write_shard(
        (f"s{i:06d}", img, "jpg", lab)
        for i, (img, lab) in enumerate(zip(images, labels, strict=True))
    )


@dataclass
class Dataset:
    shards: dict[str, tuple[list[bytes], list[int]]]
    weights: dict[str, tuple[str, str]]
    """arch -> (object name, sha256)"""
    token: str
    storage_url: str

    def transform(self) -> dict[str, object]:
        return {
            "resize": SIDE,
            "crop": SIDE,
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
        }

    def request(self, arch: str, shard: str, split: int, **extra: object) -> dict[str, object]:
        obj, sha = self.weights[arch]
        body: dict[str, object] = {
            "container": DATA,
            "shard": shard,
            "model": {
                "arch": arch,
                "num_classes": 3,
                "weights": {"container": MODELS, "object": obj, "sha256": sha},
            },
            "split_index": split,
            "transform": self.transform(),
            "b_max": 16,
        }
        body.update(extra)
        return body

    def headers(self) -> dict[str, str]:
        return {"X-Auth-Token": self.token, "X-Storage-Url": self.storage_url}


@pytest.fixture(scope="session")
def dataset(swift_stack: RunningStack) -> Dataset:
    conn: Connection = swift_stack.connection()
    conn.put_container(DATA)
    conn.put_container(MODELS)
    shards = {}
    for i, n in enumerate((20, 7)):
        images, labels = make_images(n, seed=i)
        name = f"shards/shard-{i:06d}.tar"
        conn.put_object(DATA, name, shard_bytes(images, labels))
        shards[name] = (images, labels)
    weights = {}
    for arch in ("alexnet", "resnet18", "efficientnet_lite0"):
        torch.manual_seed(0)
        pretrained = "imagenet" if arch == "efficientnet_lite0" else None
        model = hapi_models.get_model(arch, num_classes=3, weights=pretrained)
        blob = hapi_models.weights_to_bytes(model)
        obj = f"{arch}.safetensors"
        conn.put_object(MODELS, obj, blob)
        weights[arch] = (obj, hapi_models.sha256_hex(blob))
    storage_url, token = conn.get_auth()
    conn.close()
    return Dataset(shards, weights, token, storage_url)


def local_model(
    dataset: Dataset, swift_stack: RunningStack, arch: str
) -> hapi_models.SplittableModel:
    conn = swift_stack.connection()
    obj, sha = dataset.weights[arch]
    _, blob = conn.get_object(MODELS, obj)
    conn.close()
    return hapi_models.get_model(arch, num_classes=3, weights=blob, sha256=sha)
