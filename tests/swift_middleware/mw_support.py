"""Helpers of the filter tests: filtered proxies, the test data, a frame-stream reader."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from hapi_contract.frames import BatchFrame, EndFrame, FrameDecoder
from hapi_stack import RunningStack, render_proxy_conf
from tests.hapi_server.conftest import ServerProcess, free_port
from tests.readiness import ready

MW_DATA = "hapi-mw-data"
MW_MODELS = "hapi-mw-models"
SHARD = "shards/shard-000000.tar"
SHARD_META = {"X-Object-Meta-Source": "hapi-mw-test", "X-Object-Meta-Colour": "blue"}
IMAGE_SIDE = 64  # alexnet needs at least 63 pixels
HAPI = {"X-Hapi-Request": "extract"}


def imagenet_transform(side: int) -> dict[str, Any]:
    """A request body's transform: ``side`` pixels, ImageNet's normalisation."""
    return {
        "resize": side,
        "crop": side,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    }


@dataclass
class ProxyProcess(ServerProcess):
    """A Swift proxy with the filter; ``url`` is its base URL (stopped like a HAPI server)."""

    def account_url(self, account: str = "AUTH_test") -> str:
        return f"{self.url}/v1/{account}"


def start_proxy(stack: RunningStack, work_dir: Path, options: dict[str, str]) -> ProxyProcess:
    """A proxy like the stack's, on a free port, with ``[filter:hapi]`` holding ``options``."""
    port = free_port()
    config = stack.config.model_copy(
        update={
            "proxy_port": port,
            "proxy_extra_pipeline": ["hapi"],
            "proxy_extra_filters": {"hapi": options},
        }
    )
    conf = work_dir / f"proxy-{port}.conf"
    conf.write_text(render_proxy_conf(config))
    log = work_dir / f"proxy-{port}.log"
    program = Path(sys.executable).parent / "swift-proxy-server"
    proc = subprocess.Popen(  # noqa: S603
        [str(program), str(conf), "-v"], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    proxy = ProxyProcess(f"http://127.0.0.1:{port}", proc, log)
    return ready(proxy, proc, "/healthcheck", timeout=60, poll_s=0.1)


@dataclass
class MwData:
    """The filter tests' own containers (ACL changes stay out of other tests' data)."""

    token: str
    other_token: str
    images: list[bytes]
    labels: list[int]
    weights: dict[str, tuple[str, str]]
    """arch -> (object, sha256)"""

    def body(
        self, arch: str, split: int, *, side: int = IMAGE_SIDE, **extra: Any
    ) -> dict[str, Any]:
        """An ExtractRequest body without container and shard (the URL names them)."""
        obj, sha = self.weights[arch]
        body: dict[str, Any] = {
            "model": {
                "arch": arch,
                "num_classes": 3,
                "weights": {"container": MW_MODELS, "object": obj, "sha256": sha},
            },
            "split_index": split,
            "transform": imagenet_transform(side),
            "b_max": 4,
        }
        body.update(extra)
        return body

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {**HAPI, "X-Auth-Token": token or self.token}


@dataclass
class Extraction:
    status: int
    headers: httpx.Headers
    frames: list[BatchFrame]
    end: EndFrame | None
    body: bytes

    def features(self) -> torch.Tensor:
        return torch.cat([f.features for f in self.frames])

    def labels(self) -> list[int]:
        return torch.cat([f.labels for f in self.frames]).tolist()


def extract(url: str, body: object, headers: dict[str, str], **kwargs: Any) -> Extraction:
    """POST a HAPI request and decode the frame stream (or keep the error body)."""
    with httpx.stream("POST", url, json=body, headers=headers, timeout=180, **kwargs) as resp:
        if resp.status_code != 200:
            return Extraction(resp.status_code, resp.headers, [], None, resp.read())
        decoder = FrameDecoder()
        frames: list[BatchFrame] = []
        for chunk in resp.iter_bytes():
            frames += [f for f in decoder.feed(chunk) if isinstance(f, BatchFrame)]
        return Extraction(resp.status_code, resp.headers, frames, decoder.close(), b"")


def shard_url(proxy: ProxyProcess, container: str = MW_DATA, obj: str = SHARD) -> str:
    return f"{proxy.account_url()}/{container}/{obj}"
