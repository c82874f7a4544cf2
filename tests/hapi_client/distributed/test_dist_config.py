"""Multi-worker settings: validation, the world-size checks and the JSON the launcher writes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch

from hapi_client import ConfigurationError, ExtractOptions, TrainOptions
from hapi_client.distributed import (
    DistributedConfig,
    DistributedConfigError,
    GradientMessage,
    UpdateMessage,
)
from hapi_client.distributed.messages import FrameBuffer

BASE: dict[str, Any] = {"model": "models/efficientnet_lite0", "container": "train"}


def test_json_round_trip_keeps_every_setting() -> None:
    config = DistributedConfig(
        **BASE,
        aggregator="multi_krum",
        aggregator_params={"m": 3},
        f=1,
        attack="reverse",
        attackers=(5, 6),
        balance=True,
        train=TrainOptions(batch_size=70, optimizer="adam", lr=0.001),
        extract=ExtractOptions(split=21, output_dtype="float32", prefetch=4),
    )
    again = DistributedConfig.from_json(config.to_json())
    assert again == config and again.attackers == (5, 6)
    assert isinstance(again.train, TrainOptions) and isinstance(again.extract, ExtractOptions)
    saved = json.loads(config.to_json())
    assert saved["attackers"] == [5, 6]
    assert saved["extract"]["output_dtype"] == "float32" and saved["train"]["batch_size"] == 70


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": "efficientnet_lite0"}, "models/efficientnet_lite0"),
        ({"mode": "all_in_cos"}, "mode must be one of hapi, baseline"),
        ({"train": {"batch_size": 8}}, "train must be a hapi_client.TrainOptions"),
        ({"extract": TrainOptions()}, "extract must be a hapi_client.ExtractOptions"),
        ({"via": "ftp"}, "via must be one of hapi, swift"),
        ({"attackers": (1,)}, "no attack"),
        ({"attack": "nope"}, "unknown attack 'nope'"),
        ({"gather_timeout_s": float("inf")}, "gather_timeout_s"),
        ({"attack": "reverse", "attackers": (2, 2)}, "duplicate"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(DistributedConfigError, match=message):
        DistributedConfig(**{**BASE, **changes})  # type: ignore[arg-type]


def test_world_checks_include_the_rules_requirement() -> None:
    config = DistributedConfig(**BASE, aggregator="bulyan", f=1, train=TrainOptions(batch_size=70))
    config.check_world(7)
    with pytest.raises(DistributedConfigError, match=r"bulyan.*n >= 4f\+3"):
        config.check_world(6)
    with pytest.raises(DistributedConfigError, match="q=8 exceeds the 7 workers"):
        config.replace(q=8).check_world(7)
    with pytest.raises(DistributedConfigError, match=r"attacker ranks \[7\]"):
        config.replace(attack="reverse", attackers=(7,)).check_world(7)
    with pytest.raises(DistributedConfigError, match="batch_size=5 cannot give each of 7"):
        config.replace(train=TrainOptions(batch_size=5)).check_world(7)
    assert config.replace(q=5, aggregator="median").build_rule(7).n == 5


def test_from_json_refuses_unknown_settings_and_garbage() -> None:
    with pytest.raises(DistributedConfigError, match="unknown multi-worker settings: colour"):
        DistributedConfig.from_json(json.dumps({**BASE, "colour": "red"}))
    with pytest.raises(DistributedConfigError, match="not JSON"):
        DistributedConfig.from_json("{")
    with pytest.raises(DistributedConfigError, match="unknown optimizer"):
        DistributedConfig.from_json(json.dumps({**BASE, "train": {"optimizer": "lbfgs"}}))
    with pytest.raises(DistributedConfigError, match="bad multi-worker config.*colour"):
        DistributedConfig.from_json(json.dumps({**BASE, "extract": {"colour": "red"}}))


def test_the_fine_tuning_settings_are_the_option_objects_and_checked_there() -> None:
    """No copy of a training or extraction field in the multi-worker config."""
    fields = {f.name for f in dataclasses.fields(DistributedConfig)}
    shared = {f.name for f in dataclasses.fields(TrainOptions)} | {
        f.name for f in dataclasses.fields(ExtractOptions)
    }
    assert not fields & shared
    with pytest.raises(ConfigurationError, match="batch_size"):
        DistributedConfig(**BASE, train=TrainOptions(batch_size=0))


@pytest.mark.parametrize(
    ("prefetch", "batch", "world", "shard", "depth"),
    [
        (None, 350, 7, 100, 2),  # a worker's share (50) fits one shard: the floor of 2
        (None, 700, 2, 100, 5),  # a share of 350: four shards for one batch, plus the next
        (3, 700, 2, 100, 3),  # given: kept
    ],
)
def test_prefetch_follows_the_library_rule_for_one_workers_share(
    prefetch: int | None, batch: int, world: int, shard: int, depth: int
) -> None:
    config = DistributedConfig(
        **BASE,
        train=TrainOptions(batch_size=batch),
        extract=ExtractOptions(prefetch=prefetch),
    )
    assert config.prefetch_depth(world, shard) == depth


def test_messages_round_trip_through_the_frame_codec() -> None:
    grad = torch.randn(17)
    msg = GradientMessage(3, 1, 2, 40, 0.25, 0.5, 12.5, 30, 123456789012, 7, grad)
    update = UpdateMessage(3, (10, 20, 40), 2**63 - 1, grad * 2)
    buffer = FrameBuffer()
    buffer.feed(
        msg.encode()
        + update.encode()
        + GradientMessage(4, 1, 2, 1, 0, 0, 0, 0, 0, 0, None).encode()
    )
    got = GradientMessage.decode(buffer.pop()[1])  # type: ignore[index]
    assert (
        got.wire_bytes == 123456789012
        and got.gradient is not None
        and torch.equal(got.gradient, grad)
    )
    back = UpdateMessage.decode(buffer.pop()[1])  # type: ignore[index]
    assert (
        back.next_sizes == (10, 20, 40)
        and back.checksum == 2**63 - 1
        and torch.equal(back.gradient, grad * 2)
    )
    assert GradientMessage.decode(buffer.pop()[1]).gradient is None  # type: ignore[index]
    assert buffer.pop() is None
