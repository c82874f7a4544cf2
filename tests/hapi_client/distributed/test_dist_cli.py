"""``hapi finetune --workers N`` options become the right DistributedConfig (no run)."""

from __future__ import annotations

import argparse

import pytest

from hapi_cli.workers import add_worker_arguments, config_from_args
from hapi_client.distributed import DistributedConfigError, torchrun_command


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/efficientnet_lite0")
    parser.add_argument("--container", default="train")
    parser.add_argument("--workers", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=70)
    parser.add_argument("--device", default="cpu")
    add_worker_arguments(parser)
    return parser.parse_args(argv)


def test_attackers_are_the_highest_ranks_and_the_straggler_the_last() -> None:
    config = config_from_args(
        _parse(
            "--aggregator",
            "bulyan",
            "--f",
            "1",
            "--attack",
            "reverse",
            "--attackers",
            "2",
            "--straggler-delay",
            "0.05",
            "--balance",
        )
    )
    assert config.aggregator == "bulyan" and config.f == 1
    assert config.attack == "reverse" and config.attackers == (5, 6)
    assert config.straggler_rank == 6 and config.straggler_delay_s == 0.05 and config.balance
    assert config.device == "cpu" and config.threads == 1 and config.train.batch_size == 70
    config.check_world(7)


def test_no_straggler_without_a_delay_and_q_passes_through() -> None:
    config = config_from_args(_parse("--q", "6", "--aggregator", "median", "--f", "1"))
    assert config.straggler_rank is None and config.q == 6 and config.attackers == ()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--attackers", "1"), "needs --attack"),
        (("--attack", "reverse", "--attackers", "7"), r"--attackers must be in \[0, 6\]"),
        (("--attack", "teleport"), "unknown attack"),
    ],
)
def test_bad_worker_options_are_clear_errors(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(DistributedConfigError, match=message):
        config_from_args(_parse(*argv))


def test_torchrun_command_runs_the_worker_module_on_every_config() -> None:
    cmd = torchrun_command(7, ["a.json", "b.json"], python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "7"
    assert cmd[cmd.index("-m", 3) + 1 :] == [
        "hapi_client.distributed",
        "a.json",
        "b.json",
        "--log-level",
        "warning",
    ]


@pytest.mark.slow
def test_hapi_finetune_with_two_workers_end_to_end(client_env, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from hapi_cli.main import main

    metrics = tmp_path / "metrics.json"
    creds = client_env.credentials
    code = main(
        [
            "finetune",
            "--model",
            client_env.models["efficientnet_lite0"].name,
            "--container",
            client_env.train,
            "--eval-container",
            client_env.test,
            "--endpoint",
            client_env.server.url,
            "--auth-url",
            creds.auth_url,
            "--user",
            creds.user,
            "--key",
            creds.key,
            "--split",
            "freeze",
            "--image-size",
            "64",
            "--batch-size",
            "8",
            "--workers",
            "2",
            "--aggregator",
            "median",
            "--attack",
            "reverse",
            "--attackers",
            "1",
            "--metrics-json",
            str(metrics),
            "--quiet",
            "--worker-log",
            str(tmp_path / "workers.log"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, (tmp_path / "workers.log").read_text()[-3000:]
    assert "2 workers, aggregator median (q=2, f=0), attack: reverse by ranks [1], split 18" in out
    assert "eval acc" in out
    import json

    saved = json.loads(metrics.read_text())
    assert saved["world_size"] == 2 and saved["attackers"] == [1] and len(saved["history"]) == 1


def test_checkpoint_and_disk_cache_flags() -> None:
    config = config_from_args(
        _parse(
            "--checkpoint-dir",
            "ck",
            "--checkpoint-every",
            "5",
            "--feature-cache-dir",
            "fc",
            "--feature-cache-gb",
            "0.5",
        )
    )
    assert (config.checkpoint_dir, config.checkpoint_every) == ("ck", 5)
    assert (config.feature_cache_dir, config.feature_cache_bytes) == ("fc", 2**29)
    with pytest.raises(DistributedConfigError, match="checkpoint_every needs checkpoint_dir"):
        config_from_args(_parse("--checkpoint-every", "5"))


def test_restarts_reach_torchrun() -> None:
    cmd = torchrun_command(3, ["a.json"], python="py", extra_args=["--max-restarts", "1"])
    assert cmd[cmd.index("--max-restarts") + 1] == "1"
