"""Fixtures of the filter tests: real Swift proxies with the ``hapi`` filter, a real HAPI server.

Each filtered proxy is one more ``swift-proxy-server`` process on a free port in front of the
session stack's storage servers and memcached (the config is the stack's own, rendered by
``hapi_stack.render_proxy_conf`` with the filter added), so tokens from the session stack work
on all of them. A proxy is started once per session per filter configuration and stopped by
its PID at the end. The HAPI server is a real ``python -m hapi_server`` reading the session
stack's plain proxy, as the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import hapi_models
import pytest
import torch
from swiftclient.client import Connection

from hapi_stack import OTHER_USER, RunningStack
from tests.hapi_server.conftest import (
    ServerProcess,
    free_port,
    make_images,
    shard_bytes,
    start_server,
)
from tests.swift_middleware.mw_support import (
    IMAGE_SIDE,
    MW_DATA,
    MW_MODELS,
    SHARD,
    SHARD_META,
    MwData,
    ProxyProcess,
    start_proxy,
)


@pytest.fixture(scope="session")
def proxy_factory(
    swift_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ProxyProcess]]:
    started: dict[tuple[tuple[str, str], ...], ProxyProcess] = {}
    work_dir = tmp_path_factory.mktemp("hapi-proxies")

    def factory(**options: str) -> ProxyProcess:
        key = tuple(sorted(options.items()))
        if key not in started:
            started[key] = start_proxy(swift_stack, work_dir, options)
        return started[key]

    yield factory
    for proxy in started.values():
        proxy.stop()


@pytest.fixture(scope="session")
def mw_server(
    swift_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A HAPI server reading the session stack's plain proxy."""
    server = start_server(
        swift_stack,
        tmp_path_factory.mktemp("hapi-mw-server"),
        cpu_memory_budget_bytes=3 * 2**30,
        b_min=2,
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def decoupled_proxy(
    proxy_factory: Callable[..., ProxyProcess], mw_server: ServerProcess, swift_stack: RunningStack
) -> ProxyProcess:
    return proxy_factory(hapi_servers=mw_server.url, swift_url=swift_stack.proxy_url)


@pytest.fixture(scope="session")
def in_proxy_proxy(proxy_factory: Callable[..., ProxyProcess]) -> ProxyProcess:
    return proxy_factory(execution="in_proxy", torch_threads="1")


@pytest.fixture(scope="session")
def down_proxy(proxy_factory: Callable[..., ProxyProcess]) -> ProxyProcess:
    # Ports nothing listens on: both servers fail their health check.
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    return proxy_factory(hapi_servers=", ".join(dead), health_timeout="1")


@pytest.fixture(scope="session")
def mw_data(swift_stack: RunningStack) -> MwData:
    conn: Connection = swift_stack.connection()
    conn.put_container(MW_DATA)
    conn.put_container(MW_MODELS)
    images, labels = make_images(12, seed=11, side=IMAGE_SIDE)
    conn.put_object(MW_DATA, SHARD, shard_bytes(images, labels), headers=SHARD_META)
    weights = {}
    for arch in ("alexnet", "resnet18"):
        torch.manual_seed(1)
        blob = hapi_models.weights_to_bytes(hapi_models.get_model(arch, num_classes=3))
        conn.put_object(MW_MODELS, f"{arch}.safetensors", blob)
        weights[arch] = (f"{arch}.safetensors", hapi_models.sha256_hex(blob))
    _, token = conn.get_auth()
    conn.close()
    other = swift_stack.connection(OTHER_USER.name, OTHER_USER.key)
    _, other_token = other.get_auth()
    other.close()
    return MwData(token, other_token, images, labels, weights)
