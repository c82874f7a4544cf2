"""Setting up a rank: the prepared model a sequence of runs shares (``PreparedModels``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hapi_client import ExtractOptions, TrainOptions
from hapi_client.distributed import DistributedConfig, PreparedModels
from hapi_client.distributed import setup as rank_setup


def _config(**changes: Any) -> DistributedConfig:
    base: dict[str, Any] = {
        "model": "models/efficientnet_lite0",
        "container": "train",
        "train": TrainOptions(batch_size=70, seed=0),
        "extract": ExtractOptions(freeze_index=3, image_size=64),
    }
    return DistributedConfig(**{**base, **changes})


@pytest.fixture
def prepared_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Each ``prepare_model`` call (the fake builds a small network from the seed)."""
    from hapi_client.preparation import PreparedModel

    calls: list[tuple[str, dict[str, Any]]] = []

    def fake_prepare(client: object, model: str, container: str, **kw: Any) -> PreparedModel:
        calls.append((container, kw))
        torch.manual_seed(kw["seed"])
        net = nn.Sequential(nn.Linear(4, 3))
        return PreparedModel(None, None, net, None, 3, 3, None, None, 0.0)  # type: ignore[arg-type]

    monkeypatch.setattr(rank_setup, "prepare_model", fake_prepare)
    return calls


def test_a_sequence_prepares_its_model_once_and_each_run_trains_its_own_copy(
    prepared_calls: list[tuple[str, dict[str, Any]]],
) -> None:
    models = PreparedModels()
    first = models.get(None, _config())  # type: ignore[arg-type]
    with torch.no_grad():
        next(first.net.parameters()).add_(1.0)  # the first run trains its copy
    second = models.get(None, _config(aggregator="median", f=1))  # type: ignore[arg-type]
    assert len(prepared_calls) == 1
    assert second.net is not first.net
    # The second run starts from the prepared weights, not from what the first trained.
    torch.manual_seed(0)
    pristine = nn.Sequential(nn.Linear(4, 3))
    for ours, expected in zip(second.net.parameters(), pristine.parameters(), strict=True):
        assert torch.equal(ours, expected)


@pytest.mark.parametrize(
    "changes",
    [
        {"container": "other"},
        {"num_classes": 5},
        {"train": TrainOptions(batch_size=70, seed=1)},
        {"extract": ExtractOptions(freeze_index=2, image_size=64)},
        {"extract": ExtractOptions(freeze_index=3, image_size=96)},
    ],
)
def test_a_run_that_prepares_otherwise_prepares_again(
    prepared_calls: list[tuple[str, dict[str, Any]]], changes: dict[str, Any]
) -> None:
    models = PreparedModels()
    models.get(None, _config())  # type: ignore[arg-type]
    models.get(None, _config(**changes))  # type: ignore[arg-type]
    assert len(prepared_calls) == 2


class _Planned(Exception):
    """Stops ``setup_replica`` at its plan, with what it was asked for."""


def test_the_split_is_planned_for_each_rank_s_share_of_the_whole_job(
    prepared_calls: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_plan(*args: Any, **kw: Any) -> None:
        raise _Planned(kw)

    monkeypatch.setattr(rank_setup, "plan_split", fake_plan)
    monkeypatch.setattr(rank_setup, "cos_batch_cap", lambda manifest, b_max, batch: 32)
    config = _config(
        train=TrainOptions(batch_size=70, seed=0, epochs=4),
        extract=ExtractOptions(split="auto", freeze_index=3, image_size=64, cache_features=True),
    )
    with pytest.raises(_Planned) as planned:
        rank_setup.setup_replica(
            None,  # type: ignore[arg-type]
            config,
            0,
            torch.device("cpu"),
            None,  # type: ignore[arg-type]
            PreparedModels(),
            world_size=3,
        )
    (asked,) = planned.value.args
    # As the feature dataset plans it: a rank's third of each epoch, all four epochs, cached.
    assert asked["world_size"] == 3 and asked["rank"] == 0 and asked["collective"]
    assert asked["epochs"] == 4 and asked["cached"] is True
