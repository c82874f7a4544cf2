"""``plan_split`` on a made-up client: the bandwidth fallback, the epoch-boundary re-check and the
agreement of ranks, without a stack."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hapi_models
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hapi_client import BandwidthEstimator
from hapi_client.planning import (
    ClientCosts,
    PipelineCosts,
    ServerCosts,
    SplitDecision,
    plan_split,
)
from hapi_contract import Compression, DatasetLayout, OutputDtype

MBIT = 1e6 / 8
RATE = 100 * MBIT
FREEZE = 17


class _Swift:
    """Probes too short to move the moving estimate (under its minimum size), at ``RATE``."""

    def __init__(self, bandwidth: BandwidthEstimator) -> None:
        self.bandwidth = bandwidth
        self.probes = 0

    def probe(self, container: str, name: str) -> float:
        self.probes += 1
        self.probed = (container, name)
        self.bandwidth.observe(1000, 1000 / RATE)
        return RATE


@pytest.fixture(scope="module")
def prepared() -> Any:
    profile = hapi_models.profile(hapi_models.get_model("alexnet", num_classes=1000))
    manifest = SimpleNamespace(
        mean_shard_bytes_per_sample=110_000,
        shards=[SimpleNamespace(name="s", etag=None)],
        layout=DatasetLayout.SHARDS,
    )
    return SimpleNamespace(profile=profile, manifest=manifest, freeze_index=FREEZE)


def _client(override: float | None = None) -> Any:
    bandwidth = BandwidthEstimator(override=override)
    return SimpleNamespace(bandwidth=bandwidth, swift=_Swift(bandwidth), transport=None)


def _plan(client: Any, prepared: Any, choice: Any, **kw: Any) -> Any:
    return plan_split(
        client,
        prepared,
        "c",
        choice,
        batch_size=64,
        output_dtype=OutputDtype("float32"),
        compression=Compression("none"),
        b_max=10,
        **kw,
    )


def test_without_an_estimate_one_probe_counts_even_when_too_short_to_move_it(
    prepared: Any,
) -> None:
    client = _client()
    plan = _plan(client, prepared, "thesis")
    assert client.bandwidth.bytes_per_s is None  # the probe did not move the estimate...
    assert client.swift.probes == 1
    assert plan.decision.rule == "thesis"
    assert plan.decision.budget_bytes == pytest.approx(RATE)  # ...its own rate decided


def test_a_folder_datasets_probe_reads_the_models_weights_not_its_part(prepared: Any) -> None:
    """A folder part is a small list of image names: the link is probed on the weights."""
    manifest = SimpleNamespace(
        mean_shard_bytes_per_sample=12_000,
        shards=[SimpleNamespace(name="hapi-index/part-000000.jsonl", etag=None)],
        layout=DatasetLayout.FOLDER,
        data_container="images",
    )
    stored = SimpleNamespace(container="models", object="alexnet.safetensors")
    folder = SimpleNamespace(
        profile=prepared.profile, manifest=manifest, freeze_index=FREEZE, stored=stored
    )
    client = _client()
    plan = _plan(client, folder, "thesis")
    assert client.swift.probed == ("models", "alexnet.safetensors")
    assert plan.decision.budget_bytes == pytest.approx(RATE)


def test_auto_uses_the_rate_of_the_costs_read_before_probing(prepared: Any) -> None:
    client = _client()
    here = ClientCosts(0.001, [1e-4] * FREEZE, 1e-3, 1e-3)
    costs = PipelineCosts(here, None, "the server's timings are unavailable: test", RATE / 2)
    plan = _plan(client, prepared, "auto", costs=costs)
    assert client.swift.probes == 0
    assert plan.costs is costs
    assert plan.decision.budget_bytes == pytest.approx(RATE / 2)
    assert plan.decision.reason.startswith("the server's timings are unavailable: test;")


def test_forced_choices_measure_nothing(prepared: Any) -> None:
    client = _client()
    assert _plan(client, prepared, "freeze").decision.split_index == FREEZE
    assert _plan(client, prepared, 3).decision.rule == "forced"
    assert client.swift.probes == 0


def test_at_an_epoch_boundary_the_decision_stays_unless_the_bandwidth_drifted(
    prepared: Any,
) -> None:
    first = _plan(_client(RATE), prepared, "thesis").decision
    same = _plan(_client(RATE * 1.1), prepared, "thesis", current=first).decision
    assert same is first
    drifted = _plan(_client(RATE / 100), prepared, "thesis", current=first).decision
    assert drifted is not first and drifted.budget_bytes == pytest.approx(RATE / 100)


def test_at_an_epoch_boundary_auto_keeps_the_split_whose_features_are_cached(
    prepared: Any,
) -> None:
    # Layer 16 is heavy on the server and light on the client: split 17 leaves the client
    # little for the cached epochs, split 16 extracts its first epoch faster.
    server = ServerCosts(0.0, [0.0] * 16 + [0.1], [0.0] * FREEZE, [1e3] * FREEZE)
    client = ClientCosts(0.0, [0.0] * 16 + [0.05], 0.01, 0.0)
    costs = PipelineCosts(client, server)
    manifest = SimpleNamespace(**vars(prepared.manifest), num_samples=640)
    shaped = SimpleNamespace(**{**vars(prepared), "manifest": manifest})
    first = _plan(_client(RATE), shaped, "auto", costs=costs, epochs=5, cached=True).decision
    assert first.split_index == FREEZE
    # The link halves before the last epoch: from scratch one epoch favours an earlier split
    # (16 or any before it, the same here), but split 17's features are in the cache and its
    # last epoch ships nothing.
    fresh = _plan(_client(RATE / 2), shaped, "auto", costs=costs, epochs=1, cached=True)
    assert fresh.decision.split_index < FREEZE
    last = _plan(
        _client(RATE / 2), shaped, "auto", costs=costs, current=first, epochs=1, cached=True
    ).decision
    assert last.split_index == FREEZE and last.job is not None
    assert last.job.cached_split == FREEZE


def _rank(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        profile = hapi_models.profile(hapi_models.get_model("alexnet", num_classes=1000))
        manifest = SimpleNamespace(
            mean_shard_bytes_per_sample=110_000,
            shards=[SimpleNamespace(name="s", etag=None)],
            layout=DatasetLayout.SHARDS,
        )
        prepared = SimpleNamespace(profile=profile, manifest=manifest, freeze_index=FREEZE)
        # Only rank 0 measures: the other rank's client would fail if it were touched.
        client = _client(RATE / 100) if rank == 0 else SimpleNamespace()
        decision: SplitDecision = _plan(
            client, prepared, "thesis", rank=rank, collective=True
        ).decision
        Path(out, f"{rank}.json").write_text(
            json.dumps({"index": decision.split_index, "rule": decision.rule})
        )
        dist.barrier()  # neither rank closes its connections while the other still reads
    finally:
        dist.destroy_process_group()


def test_rank_0_plans_and_every_rank_gets_its_index(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert got[0]["rule"] == "thesis" and got[1]["rule"] == "agreed"
    assert got[0]["index"] == got[1]["index"]
