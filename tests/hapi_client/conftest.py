"""Client fixtures: a real HAPI server next to the session's real Swift, and small datasets."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hapi_client import HapiClient, RetryPolicy, StoredModel, SwiftCredentials, upload_model
from hapi_client.datasets import get_source, upload_dataset
from hapi_stack import RunningStack
from tests.hapi_server.conftest import ServerProcess, start_server


@dataclass
class ClientEnv:
    stack: RunningStack
    server: ServerProcess
    credentials: SwiftCredentials
    models: dict[str, StoredModel]
    train: str
    test: str
    log_dir: Path

    def client(self, credentials: SwiftCredentials | None = None, **kwargs: object) -> HapiClient:
        kwargs.setdefault("retry", RetryPolicy(attempts=8, backoff_s=0.2, max_backoff_s=2.0))
        creds = credentials or self.credentials
        return HapiClient(self.server.url, creds, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def client_env(
    swift_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClientEnv]:
    log_dir = tmp_path_factory.mktemp("client-server-logs")
    server = start_server(swift_stack, log_dir, None, cpu_memory_budget_bytes=3 * 2**30, b_min=4)
    conn = swift_stack.connection()
    models = {}
    for arch in ("efficientnet_lite0", "alexnet"):
        models[arch], _ = upload_model(conn, arch, container="client-models")
    upload_dataset(
        conn,
        get_source("photos:train?per_class=8&size=96x72"),
        "photos-train",
        shard_size=10,
        progress=False,
    )
    upload_dataset(
        conn,
        get_source("photos:test?per_class=4&size=96x72"),
        "photos-test",
        shard_size=10,
        progress=False,
    )
    conn.close()
    creds = SwiftCredentials(swift_stack.auth_url, swift_stack.admin_user, swift_stack.admin_key)
    env = ClientEnv(swift_stack, server, creds, models, "photos-train", "photos-test", log_dir)
    try:
        yield env
    finally:
        env.server.stop()  # the restart test replaces the server: stop the current one
