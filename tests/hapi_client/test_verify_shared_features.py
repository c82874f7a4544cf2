"""``verify_fraction`` when the features come from the server's feature store (issue 32): honest
stored features pass, and features altered on their way to the client are still caught."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from hapi_client import FeatureDataset, HapiClient, VerificationError
from hapi_contract import ExtractRequest
from tests.hapi_server.server_helpers import metric

from .conftest import ClientEnv
from .shared_store import start_store_server, store_job


@pytest.fixture(scope="module")
def store_env(client_env: ClientEnv) -> Iterator[ClientEnv]:
    """The session's data and models behind a server with the store at its default bound."""
    server = start_store_server(client_env)
    try:
        yield dataclasses.replace(client_env, server=server)
    finally:
        server.stop()


def _dataset(env: ClientEnv, client: HapiClient) -> FeatureDataset:
    return store_job(env, client, verify_fraction=1.0, verify_samples=80)


def test_verification_checks_features_served_from_the_store(store_env: ClientEnv) -> None:
    with store_env.client() as client:
        assert sum(len(y) for _, y in _dataset(store_env, client)) == 80  # fills the store
        hits = metric(store_env.server, "hapi_feature_store_hits_total") or 0.0
        honest = _dataset(store_env, client)
        assert sum(len(y) for _, y in honest) == 80
        assert (metric(store_env.server, "hapi_feature_store_hits_total") or 0.0) >= hits + 8
        assert honest.verifier is not None and honest.verifier.checked_shards == 8

        extract = client.transport.extract

        def tampered(req: ExtractRequest, num_samples: int | None = None) -> Any:
            got = extract(req, num_samples)
            got.features[1:2] *= 1.1  # one stored sample's features scaled by 10 %
            return got

        client.transport.extract = tampered  # type: ignore[method-assign]
        with pytest.raises(VerificationError, match="not to be trusted"):
            list(_dataset(store_env, client))
