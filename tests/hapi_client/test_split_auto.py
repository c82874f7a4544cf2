"""``split="auto"`` against the real stack: the server's measured costs drive a timed choice."""

from __future__ import annotations

import hapi_models

from hapi_client import FeatureDataset, HapiClient

from .conftest import ClientEnv

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _alexnet(env: ClientEnv, client: HapiClient, split: str) -> FeatureDataset:
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
        best = min(t.iteration_s for t in decision.predictions)
        chosen = decision.predictions[decision.split_index]
        assert chosen.iteration_s <= best * 1.02
        assert all(t.server_s > 0 for t in decision.predictions[1:])
        assert decision.predictions[0].server_s == 0.0
        # Split 0 ships the stored shard bytes; the others the server's measured frame sizes.
        stored = ds.manifest.mean_shard_bytes_per_sample * 10
        assert decision.predictions[0].wire_bytes == stored
        assert "runner-up" in decision.reason
        # The features stream at the chosen split, the rest of the model runs here.
        features, labels = next(iter(ds))
        assert features.shape[0] == labels.shape[0] == 10


def test_thesis_rule_and_fallback_without_server_timings(client_env: ClientEnv) -> None:
    with client_env.client() as client:
        thesis = _alexnet(client_env, client, "thesis")
        assert thesis.decision.rule == "thesis" and not thesis.decision.predictions
    # Through the Swift filter there is no server to time the head: Algorithm 2, said so.
    with client_env.client(via="swift") as client:
        fallback = _alexnet(client_env, client, "auto")
        assert fallback.decision.rule == "thesis"
        assert "Swift filter" in fallback.decision.reason
