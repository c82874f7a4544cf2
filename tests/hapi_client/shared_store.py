"""What the feature-store tests share (issue 32): their server's settings and the job they run.

Every job of those tests reads the same data in the same order (one data seed): each job's
batches are the others', so a delivery can be checked against an uninterrupted one batch by
batch, and the server's store serves what an earlier job left.
"""

from __future__ import annotations

from typing import Any

from hapi_client import FeatureDataset, HapiClient
from hapi_core.settings import CoreSettings
from tests.hapi_server.conftest import ServerProcess, start_server

from .conftest import ClientEnv
from .test_feature_dataset import MODEL, SMALL

#: The session's server settings, with the feature store at its default bound.
STORE_SETTINGS: dict[str, Any] = {
    "cpu_memory_budget_bytes": 3 * 2**30,
    "b_min": 4,
    "feature_store_bytes": CoreSettings().feature_store_bytes,
}


def start_store_server(env: ClientEnv) -> ServerProcess:
    """A server of its own over the session's Swift, with :data:`STORE_SETTINGS`."""
    return start_server(env.stack, env.log_dir, None, **STORE_SETTINGS)


def store_job(env: ClientEnv, client: HapiClient, **options: Any) -> FeatureDataset:
    """The tests' job: the session's training data at the freeze index, no client cache."""
    return FeatureDataset(
        client,
        model=env.models[MODEL].name,
        container=env.train,
        batch_size=8,
        split="freeze",
        transform=SMALL,
        seed=3,
        cache_features=False,
        **options,
    )
