"""Multi-worker settings: validation, the world-size checks and the JSON the launcher writes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

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
        split=21,
    )
    again = DistributedConfig.from_json(config.to_json())
    assert again == config and again.attackers == (5, 6)
    assert json.loads(config.to_json())["attackers"] == [5, 6]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": "efficientnet_lite0"}, "models/efficientnet_lite0"),
        ({"mode": "all_in_cos"}, "mode must be one of hapi, baseline"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"split": "middle"}, "split must be 'auto'"),
        ({"attackers": (1,)}, "no attack"),
        ({"attack": "nope"}, "unknown attack 'nope'"),
        ({"gather_timeout_s": float("inf")}, "gather_timeout_s"),
        ({"optimizer": "lbfgs"}, "unknown optimizer"),
        ({"attack": "reverse", "attackers": (2, 2)}, "duplicate"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(DistributedConfigError, match=message):
        DistributedConfig(**{**BASE, **changes})  # type: ignore[arg-type]


def test_world_checks_include_the_rules_requirement() -> None:
    config = DistributedConfig(**BASE, aggregator="bulyan", f=1, batch_size=70)
    config.check_world(7)
    with pytest.raises(DistributedConfigError, match=r"bulyan.*n >= 4f\+3"):
        config.check_world(6)
    with pytest.raises(DistributedConfigError, match="q=8 exceeds the 7 workers"):
        config.replace(q=8).check_world(7)
    with pytest.raises(DistributedConfigError, match=r"attacker ranks \[7\]"):
        config.replace(attack="reverse", attackers=(7,)).check_world(7)
    with pytest.raises(DistributedConfigError, match="batch_size=5 cannot give each of 7"):
        config.replace(batch_size=5).check_world(7)
    assert config.replace(q=5, aggregator="median").build_rule(7).n == 5


def test_from_json_refuses_unknown_settings_and_garbage() -> None:
    with pytest.raises(DistributedConfigError, match="unknown multi-worker settings: colour"):
        DistributedConfig.from_json(json.dumps({**BASE, "colour": "red"}))
    with pytest.raises(DistributedConfigError, match="not JSON"):
        DistributedConfig.from_json("{")


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
