"""Multi-worker fine-tuning end to end: 7 torchrun workers, real Swift, a real HAPI server.

One torchrun job runs every configuration of this module back to back
(:func:`~hapi_client.distributed.launch_many`): the workers start once and extract the
Fashion-MNIST features through HAPI once; later runs read them from each worker's feature cache.

Setup: EfficientNet-Lite0 with its ImageNet weights, 64 px inputs, split = freeze index = 21
(the HAPI server runs everything up to and including the global pool, layer 20; the client
trains the classifier only, on 1280 floats per sample). 2100 training and 1000 held-out images
in shards of 100 (3 shards per worker), a global batch of 350 (50 per worker), SGD lr 0.003,
momentum 0.9, 30 epochs, f = 1 declared, rank 6 the one attacker (reversed and x -100).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hapi_client import ExtractOptions, TrainOptions
from hapi_client.datasets import get_source, upload_dataset
from hapi_client.distributed import DistributedConfig, DistributedResult, launch_many
from tests.hapi_client.conftest import ClientEnv
from tests.hapi_server.conftest import ServerProcess, start_server

pytestmark = [pytest.mark.slow, pytest.mark.swift]

WORKERS = 7
TRAIN, TEST = "dist-fmnist-train", "dist-fmnist-test"
RULES = ("median", "multi_krum", "bulyan")
STRAGGLER, DELAY_S, STRAGGLER_BATCH = 6, 0.02, 70
RESULTS = Path(__file__).resolve().parents[3] / "bench-results" / "robust_accuracy.json"


@pytest.fixture(scope="module")
def server(
    client_env: ClientEnv, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    # Its own server with 2 torch threads: extraction is the slow part of this module.
    proc = start_server(
        client_env.stack,
        tmp_path_factory.mktemp("dist-server"),
        None,
        cpu_memory_budget_bytes=3 * 2**30,
        b_min=4,
        torch_threads=2,
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def runs(
    client_env: ClientEnv, server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, DistributedResult]:
    conn = client_env.stack.connection()
    upload_dataset(
        conn, get_source("fashion-mnist:train?limit=2100"), TRAIN, shard_size=100, progress=False
    )
    upload_dataset(
        conn, get_source("fashion-mnist:test?limit=1000"), TEST, shard_size=100, progress=False
    )
    conn.close()
    base = DistributedConfig(
        model=client_env.models["efficientnet_lite0"].name,
        container=TRAIN,
        eval_container=TEST,
        endpoint=server.url,
        train=TrainOptions(batch_size=350, epochs=30, lr=0.003, momentum=0.9, seed=0),
        extract=ExtractOptions(split=21, freeze_index=21, image_size=64),
        aggregator="average",
        f=1,
        gather_timeout_s=300,
    )
    attacked = base.replace(attack="reverse", attackers=(6,))
    # The straggler runs reuse the cached features; no evaluation, a smaller batch for more rounds.
    slow = base.replace(
        eval_container=None,
        train=base.train.replace(batch_size=STRAGGLER_BATCH, epochs=2),
        straggler_rank=STRAGGLER,
        straggler_delay_s=DELAY_S,
    )
    configs = {
        "no attack, average": base,
        "average": attacked,
        **{rule: attacked.replace(aggregator=rule) for rule in RULES},
        # The attacker sends nothing at all; the aggregator waits for the fastest q = 6 only.
        "drop, q=6, median": attacked.replace(
            aggregator="median", attack="drop", q=6, train=attacked.train.replace(epochs=5)
        ),
        "straggler, equal shares": slow,
        "straggler, LB-BSP": slow.replace(balance=True),
        # q = 6: the aggregator never waits for the straggler, which skips the rounds it missed.
        "straggler, q=6": slow.replace(q=6, train=slow.train.replace(epochs=1)),
    }
    log = tmp_path_factory.mktemp("dist-runs") / "torchrun.log"
    results = launch_many(
        WORKERS,
        list(configs.values()),
        credentials=client_env.credentials,
        log_path=log,
        timeout_s=1200,
        log_level="info",
    )
    return dict(zip(configs, results, strict=True))


def test_robust_rules_learn_under_a_reversed_gradient_attack(
    runs: dict[str, DistributedResult],
) -> None:
    accuracy = {
        name: runs[name].final_eval_accuracy for name in ("no attack, average", "average", *RULES)
    }
    assert all(a is not None for a in accuracy.values())
    clean = accuracy["no attack, average"]
    table = [
        {
            "aggregator": name.removeprefix("no attack, "),
            "attack": "none" if name.startswith("no attack") else "reverse x-100 (rank 6)",
            "eval_accuracy": round(acc, 4),
            "delta_points": round(100 * (acc - clean), 1),
        }
        for name, acc in accuracy.items()
        if acc is not None and clean is not None
    ]
    print("\naggregator   attack                    eval accuracy   vs attack-free")
    for row in table:
        print(
            f"{row['aggregator']:<12} {row['attack']:<25} {row['eval_accuracy']:.3f}           "
            f"{row['delta_points']:+.1f} points"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "setup": {
                    "workers": WORKERS,
                    "f": 1,
                    "attackers": [6],
                    "attack": "reverse (x -100)",
                    "model": "efficientnet_lite0 (ImageNet), split = freeze = 21, 64 px",
                    "train_samples": 2100,
                    "eval_samples": 1000,
                    "global_batch": 350,
                    "epochs": 30,
                    "optimizer": "sgd lr 0.003 momentum 0.9",
                },
                "results": table,
            },
            indent=2,
        )
        + "\n"
    )
    assert clean is not None and clean > 0.7
    assert accuracy["average"] is not None and accuracy["average"] < 0.3  # chance is 0.1
    for rule in RULES:
        acc = accuracy[rule]
        assert acc is not None and acc >= clean - 0.03, (rule, acc, clean)
    for name in ("average", *RULES):
        history = runs[name].history
        # Every round used all 7 replies (q = n): the attacker is outvoted, not silenced.
        assert all(m.replies_used == WORKERS * m.rounds and m.samples == 2100 for m in history)
    # One job, one extraction: later runs found every training shard in the workers' caches.
    assert runs["no attack, average"].history[0].requests == 21
    assert all(m.requests == 0 for name in ("average", *RULES) for m in runs[name].history)


def test_lbbsp_shrinks_the_stragglers_share_and_the_round_time(
    runs: dict[str, DistributedResult],
) -> None:
    equal, balanced = runs["straggler, equal shares"], runs["straggler, LB-BSP"]
    assert all(sizes[STRAGGLER] == STRAGGLER_BATCH // WORKERS for sizes in equal.round_sizes[:-1])
    final = balanced.history[-1].batch_sizes
    assert sum(final) == STRAGGLER_BATCH and final[STRAGGLER] < STRAGGLER_BATCH // WORKERS
    assert final[STRAGGLER] == min(final)
    last = 20
    slow = sum(equal.round_seconds[-last:]) / last
    fast = sum(balanced.round_seconds[-last:]) / last
    print(
        f"\nstraggler (rank {STRAGGLER}, {DELAY_S * 1e3:.0f} ms per sample): mean of the last {last} rounds "
        f"{slow * 1e3:.1f} ms with equal shares, {fast * 1e3:.1f} ms with LB-BSP; final shares {final}"
    )
    assert fast < slow


def test_a_silent_attacker_is_not_waited_for(runs: dict[str, DistributedResult]) -> None:
    result = runs["drop, q=6, median"]
    assert result.q == 6
    for m in result.history:
        assert (
            m.replies_used == 6 * m.rounds and m.replies_missing == m.rounds and m.samples == 2100
        )
    final = result.final_eval_accuracy
    assert final is not None and final > 0.6


def test_a_late_worker_skips_closed_rounds_instead_of_falling_behind(
    runs: dict[str, DistributedResult],
) -> None:
    (epoch,) = runs["straggler, q=6"].history
    assert epoch.replies_used == 6 * epoch.rounds and epoch.samples == 2100
    # The straggler found the update of a round it had not even started waiting for it: it
    # applied it without computing (its share of that round goes unused, as with any q < n).
    assert epoch.skipped_rounds > 0
