"""``split="auto"`` against the real stack: the server's measured costs drive a timed choice."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import hapi_models
import pytest

from hapi_client import ConfigurationError, FeatureDataset, HapiClient
from hapi_client.planning import costs
from hapi_client.planning.time_rule import TIE_TOLERANCE
from hapi_core.timing_cache import SETTLE_MEASUREMENTS
from tests.hapi_client.conftest import ClientEnv
from tests.swift_middleware.mw_support import start_proxy

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _alexnet(env: ClientEnv, client: HapiClient, split: str | int) -> FeatureDataset:
    return FeatureDataset(
        client,
        env.train,
        env.models["alexnet"].name,
        batch_size=10,
        split=split,  # type: ignore[arg-type]
        transform=SMALL,
    )


def test_auto_takes_the_fastest_predicted_split(client_env: ClientEnv) -> None:
    with client_env.client() as client:
        ds = _alexnet(client_env, client, "auto")
        decision = ds.decision
        assert decision.rule == "time"
        assert [t.split for t in decision.predictions] == list(range(ds.freeze_index + 1))
        # Ranked over the dataset's epoch, batches of 10 on one rank (the first batch through
        # every stage counts too, so this is not the smallest time per iteration).
        assert decision.iterations == -(-ds.manifest.num_samples // 10)
        predicted = [t.predicted_s(decision.iterations) for t in decision.predictions]
        assert predicted[decision.split_index] <= min(predicted) * TIE_TOLERANCE
        assert all(t.server_s > 0 for t in decision.predictions[1:])
        assert decision.predictions[0].server_s == 0.0
        # Split 0 ships the stored shard bytes; the others the server's measured frame sizes.
        stored = ds.manifest.mean_shard_bytes_per_sample * 10
        assert decision.predictions[0].wire_bytes == stored
        assert "runner-up" in decision.reason
        # The features stream at the chosen split, the rest of the model runs here.
        features, labels = next(iter(ds))
        assert features.shape[0] == labels.shape[0] == 10


def test_thesis_rule_on_request(client_env: ClientEnv) -> None:
    with client_env.client() as client:
        thesis = _alexnet(client_env, client, "thesis")
        assert thesis.decision.rule == "thesis" and not thesis.decision.predictions


@pytest.fixture(scope="module")
def filter_proxy(client_env: ClientEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A proxy of the session's Swift with the HAPI filter in front of the client's server;
    yields its auth URL."""
    stack = client_env.stack
    proxy = start_proxy(
        stack,
        tmp_path_factory.mktemp("split-auto-proxy"),
        {"hapi_servers": client_env.server.url, "swift_url": stack.proxy_url},
    )
    try:
        yield stack.auth_url.replace(stack.proxy_url, proxy.url)
    finally:
        proxy.stop()


def test_auto_through_the_swift_filter_uses_the_filters_timings(
    client_env: ClientEnv, filter_proxy: str
) -> None:
    creds = dataclasses.replace(client_env.credentials, auth_url=filter_proxy)
    with client_env.client(credentials=creds, via="swift") as client:
        ds = _alexnet(client_env, client, "auto")
        assert ds.decision.rule == "time", ds.decision.reason
        assert all(t.server_s > 0 for t in ds.decision.predictions[1:])
        features, _ = next(iter(ds))
        assert features.shape[0] == 10


def test_via_swift_without_the_filter_is_refused_before_any_post(
    client_env: ClientEnv,
) -> None:
    """The session's plain proxy has no HAPI filter: the dataset's preflight refuses it at once,
    for ``auto`` and a fixed split alike, before any POST, which Swift would take for a
    metadata update of the shard (202, the shard's metadata dropped)."""
    conn = client_env.stack.connection()
    objects = conn.get_container(client_env.train)[1]
    name = next(o["name"] for o in objects if o["name"].endswith(".tar"))
    with client_env.client(via="swift") as client:
        before = conn.head_object(client_env.train, name)
        for split in ("auto", 3):
            with pytest.raises(ConfigurationError, match="no HAPI filter"):
                _alexnet(client_env, client, split)
        after = conn.head_object(client_env.train, name)
    conn.close()
    assert after["last-modified"] == before["last-modified"]


def test_a_resumed_auto_dataset_ends_its_epoch_on_the_saved_split_then_plans_afresh(
    client_env: ClientEnv,
) -> None:
    """``load_state_dict`` pins the saved split for the rest of the saved epoch only: the
    features already delivered came from it, the next epoch is planned as a new dataset's."""
    with client_env.client() as client:
        planned = _alexnet(client_env, client, "auto").split_index
        saved = 2 if planned != 2 else 5
        before = _alexnet(client_env, client, saved)
        batches = iter(before)
        head = [next(batches), next(batches)]
        state = before.state_dict()
        assert state["split_index"] == saved and state["batches_done"] == len(head)
        rest = [(x.shape, y.tolist()) for x, y in batches]

        resumed = _alexnet(client_env, client, "auto")
        model = resumed.local_model()
        resumed.load_state_dict(state)
        resumed.set_epoch(0)
        assert resumed.split_index == model.split == saved
        assert [(x.shape, y.tolist()) for x, y in resumed] == rest
        assert resumed.epoch == 1

        features, _ = next(iter(resumed))  # the next epoch: planned afresh
        assert resumed.decision.rule == "time", resumed.decision.reason
        assert model.split == resumed.split_index
        assert resumed.state_dict()["split_index"] == resumed.split_index
        assert features.shape[0] == 10


@pytest.mark.parametrize("cache_features", [True, False])
def test_auto_ranks_the_whole_job_it_is_told_of(
    client_env: ClientEnv, cache_features: bool
) -> None:
    """The epochs and whether the feature cache serves the later ones reach the rule, which
    ranks (and prints) the job's predicted time."""
    with client_env.client() as client:
        ds = FeatureDataset(
            client,
            client_env.train,
            client_env.models["alexnet"].name,
            batch_size=10,
            transform=SMALL,
            epochs=3,
            cache_features=cache_features,
        )
        job = ds.decision.job
        assert job is not None and job.epochs == 3 and job.cached is cache_features
        assert job.iterations == ds.decision.iterations and job.planning_s > 0
        predicted = [t.job_s(job) for t in ds.decision.predictions]
        assert predicted[ds.split_index] <= min(predicted) * TIE_TOLERANCE
        assert "s for the job" in ds.decision.reason


def test_a_settled_network_is_not_timed_again(
    client_env: ClientEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once ``SETTLE_MEASUREMENTS`` plans (this module's earlier ones count) have timed the
    network, the server answers from the timings it kept (its head not run: the encoding times
    come back to the bit) and the client reads its own from the disk cache (a new process's
    in-memory cache is empty)."""
    with client_env.client() as client:
        first = _alexnet(client_env, client, "auto")
    plans = [first]
    while len(plans) <= SETTLE_MEASUREMENTS:
        monkeypatch.setattr(costs, "_client_costs", {})
        with client_env.client() as client:
            plans.append(_alexnet(client_env, client, "auto"))
        latest = plans[-1]._costs
        assert latest is not None and latest.server is not None
        if latest.server.cached:
            break
    a, b = plans[-2]._costs, plans[-1]._costs
    assert a is not None and b is not None and a.server is not None and b.server is not None
    assert b.server.cached
    assert list(b.server.encode_s) == list(a.server.encode_s)
    assert list(b.client.layer_s) == list(a.client.layer_s)
