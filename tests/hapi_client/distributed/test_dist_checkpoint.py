"""Checkpoints: round trip of model, optimizer and position; atomic replacement; damage and
another run's checkpoint refused by name; q and the rule's requirement in a resized world;
the sample log's view of what the final model trained on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from hapi_client import ExtractOptions, TrainOptions
from hapi_client.distributed import (
    Checkpoint,
    DistributedConfig,
    DistributedConfigError,
    TrainingCheckpointError,
    delivered,
    load_checkpoint,
    round_seed,
    save_checkpoint,
)
from hapi_client.distributed.checkpoint import (
    CHECKPOINT_FILE,
    load_model_state,
    optimizer_from_parts,
    optimizer_to_parts,
)

FINGERPRINT = {"model": "models/efficientnet_lite0", "split": 21, "dataset_sha256": "ab"}


def _trained(kind: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, 3))
    opt: torch.optim.Optimizer = (
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        if kind == "sgd"
        else torch.optim.Adam(net.parameters(), lr=0.01)
    )
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(net(torch.randn(8, 6)), torch.randint(0, 3, (8,))).backward()
        opt.step()
    return net, opt


def _checkpoint(net: nn.Module, opt: torch.optim.Optimizer, round_: int = 7) -> Checkpoint:
    parts, tensors = optimizer_to_parts(opt)
    return Checkpoint(
        fingerprint=dict(FINGERPRINT),
        epoch=1,
        rounds_done=3,
        global_round=round_,
        world_size=4,
        first_world_size=4,
        assignment=[2, 2, 2, 2],
        stats={"loss_sum": 1.5, "samples": 24},
        history=[{"epoch": 1, "loss": 0.5}],
        round_seconds=[0.1] * round_,
        round_sizes=[[2, 2, 2, 2]] * round_,
        optimizer=parts,
        model=net.state_dict(),
        optimizer_tensors=tensors,
        done=torch.tensor([True, False, True]),
    )


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_restored_replica_takes_the_same_next_step(tmp_path: Path, kind: str) -> None:
    net, opt = _trained(kind)
    save_checkpoint(tmp_path, _checkpoint(net, opt))
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None
    fresh, fresh_opt = _trained("sgd" if kind == "sgd" else "adam")
    for p in fresh.parameters():
        p.data.zero_()
    if kind == "adam":
        fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    load_model_state(fresh, loaded.model)
    optimizer_from_parts(fresh_opt, loaded.optimizer, loaded.optimizer_tensors)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    for model, optimizer in ((net, opt), (fresh, fresh_opt)):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    for a, b in zip(net.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert (loaded.epoch, loaded.rounds_done, loaded.global_round) == (1, 3, 7)
    assert loaded.done is not None and loaded.done.tolist() == [True, False, True]
    assert loaded.stats == {"loss_sum": 1.5, "samples": 24}


def test_the_files_are_json_and_safetensors_and_only_the_latest_is_kept(tmp_path: Path) -> None:
    net, opt = _trained("sgd")
    save_checkpoint(tmp_path, _checkpoint(net, opt, 7))
    save_checkpoint(tmp_path, _checkpoint(net, opt, 9))
    meta = json.loads((tmp_path / CHECKPOINT_FILE).read_text())
    assert meta["global_round"] == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        CHECKPOINT_FILE,
        "state-000000009.safetensors",
    ]
    header = (tmp_path / meta["tensors"]).read_bytes()
    assert header[8:9] == b"{"  # safetensors: an 8-byte length, then a JSON header


def test_a_crash_while_writing_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    net, opt = _trained("sgd")
    save_checkpoint(tmp_path, _checkpoint(net, opt, 7))
    real_replace = os.replace

    def crash_on_json(src: str, dst: str) -> None:
        if str(dst).endswith(CHECKPOINT_FILE):
            raise OSError("killed")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_json)
    with pytest.raises(OSError, match="killed"):
        save_checkpoint(tmp_path, _checkpoint(net, opt, 9))
    monkeypatch.undo()
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.global_round == 7
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_no_checkpoint_is_none_and_damage_is_an_error(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path) is None
    net, opt = _trained("sgd")
    save_checkpoint(tmp_path, _checkpoint(net, opt))
    tensors = next(tmp_path.glob("state-*"))
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 0xFF
    tensors.write_bytes(bytes(data))
    with pytest.raises(TrainingCheckpointError, match="sha256"):
        load_checkpoint(tmp_path)
    tensors.unlink()
    with pytest.raises(TrainingCheckpointError, match="damaged"):
        load_checkpoint(tmp_path)
    (tmp_path / CHECKPOINT_FILE).write_text("{not json")
    with pytest.raises(TrainingCheckpointError, match="damaged"):
        load_checkpoint(tmp_path)


def test_another_runs_checkpoint_is_refused_naming_the_difference(tmp_path: Path) -> None:
    net, opt = _trained("sgd")
    save_checkpoint(tmp_path, _checkpoint(net, opt))
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None
    loaded.check_fingerprint(dict(FINGERPRINT), tmp_path)
    other = {**FINGERPRINT, "split": 12, "dataset_sha256": "cd"}
    with pytest.raises(TrainingCheckpointError, match=r"split: checkpoint 21, this run 12") as info:
        loaded.check_fingerprint(other, tmp_path)
    assert "dataset_sha256" in str(info.value) and "model" not in str(info.value)


def test_a_model_or_optimizer_of_another_shape_is_refused(tmp_path: Path) -> None:
    net, opt = _trained("sgd")
    save_checkpoint(tmp_path, _checkpoint(net, opt))
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None
    other = nn.Sequential(nn.Linear(6, 4))
    with pytest.raises(TrainingCheckpointError, match="model does not fit"):
        load_model_state(other, loaded.model)
    with pytest.raises(TrainingCheckpointError, match="optimizer state does not fit"):
        optimizer_from_parts(
            torch.optim.SGD(other.parameters(), lr=0.1), loaded.optimizer, loaded.optimizer_tensors
        )


def test_round_seeds_differ_by_rank_and_round_and_repeat() -> None:
    seeds = {round_seed(0, rank, r) for rank in range(4) for r in range(50)}
    assert len(seeds) == 200
    assert round_seed(3, 1, 9) == round_seed(3, 1, 9)


def _config(**kwargs: object) -> DistributedConfig:
    return DistributedConfig(model="models/efficientnet_lite0", container="c", **kwargs)  # type: ignore[arg-type]


def test_a_resized_world_keeps_f_and_the_replies_not_waited_for() -> None:
    assert _config().resized(3, 4).workers_q(3) == 3
    assert _config(q=6).resized(5, 7).q == 4
    assert _config(q=6).resized(7, 7).q == 6
    assert _config(q=1).resized(2, 4).q == 1


def test_the_rules_requirement_is_checked_for_the_new_world() -> None:
    bulyan = _config(aggregator="bulyan", f=1)
    bulyan.resized(7, 8).check_world(7)
    with pytest.raises(DistributedConfigError, match=r"n >= 4f\+3"):
        bulyan.resized(6, 7).check_world(6)


def test_checkpoint_settings_are_checked() -> None:
    with pytest.raises(DistributedConfigError, match="checkpoint_every needs checkpoint_dir"):
        _config(checkpoint_every=5)
    with pytest.raises(DistributedConfigError, match="checkpoint_every must be >= 1"):
        _config(checkpoint_dir="x", checkpoint_every=0)
    with pytest.raises(DistributedConfigError, match="feature_cache_bytes"):
        _config(feature_cache_dir="x", feature_cache_bytes=0)
    config = _config(checkpoint_dir="c", checkpoint_every=5, feature_cache_dir="f")
    assert DistributedConfig.from_json(config.to_json()) == config


def _round(attempt: int, epoch: int, round_: int, samples: list[list[int]]) -> dict[str, object]:
    return {
        "event": "round",
        "attempt": attempt,
        "epoch": epoch,
        "round": round_,
        "samples": samples,
    }


def test_delivered_drops_the_rounds_a_restart_trained_again() -> None:
    records = [
        {"event": "start", "attempt": 10, "resumed_round": 0},
        _round(10, 0, 1, [[0, 0], [0, 1]]),
        _round(10, 0, 2, [[0, 2]]),  # after the checkpoint of round 1: trained again below
        {"event": "start", "attempt": 20, "resumed_round": 1},
        _round(20, 0, 2, [[0, 2], [0, 3]]),
        _round(20, 1, 3, [[0, 1]]),
    ]
    assert delivered(records) == {0: [(0, 0), (0, 1), (0, 2), (0, 3)], 1: [(0, 1)]}


def _resume_from(first_world: int, split: int = 21) -> Checkpoint:
    return Checkpoint(
        fingerprint={"split": split},
        epoch=1,
        rounds_done=2,
        global_round=12,
        world_size=first_world,
        first_world_size=first_world,
        assignment=[1] * first_world,
    )


def test_a_job_resumed_on_fewer_workers_names_both_worlds_when_the_rule_fails() -> None:
    from hapi_client.distributed.trainer import for_world

    bulyan = _config(aggregator="bulyan", f=1, train=TrainOptions(batch_size=70))
    with pytest.raises(
        DistributedConfigError,
        match=r"the job started with 7 workers and now has 6: .*requires n >= 4f\+3",
    ):
        for_world(bulyan, 6, _resume_from(7))
    assert for_world(bulyan, 8, _resume_from(7)).workers_q(8) == 8


def test_a_resumed_job_trains_at_the_checkpoints_split_when_a_rule_chooses() -> None:
    from hapi_client.distributed.trainer import for_world

    auto = _config(extract=ExtractOptions(split="auto"))
    assert for_world(auto, 2, _resume_from(2, split=17)).extract.split == 17
    fixed = _config(extract=ExtractOptions(split=12))
    assert for_world(fixed, 2, _resume_from(2, split=17)).extract.split == 12  # refused later
