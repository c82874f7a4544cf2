"""Where the gradient channel listens and what rank 0 advertises: never a loopback address to a
worker that may run on another node (issue 22: Debian's /etc/hosts maps a host's own name to
127.0.1.1, and rank 0 used to advertise that)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hapi_client.distributed import (
    AggregatorChannel,
    ChannelError,
    DistributedConfig,
    WorkerChannel,
)
from hapi_client.distributed.addresses import (
    choose_channel_address,
    is_loopback_host,
    resolve_host,
)
from hapi_client.distributed.errors import DistributedConfigError

ROOT = Path(__file__).resolve().parents[3]

#: node0's /etc/hosts as Debian writes it, seen from node0; node1 resolves node0 by DNS.
DEBIAN_HOSTS = {"node0": ["127.0.1.1"], "localhost": ["127.0.0.1"]}


def fake_resolver(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    return lambda host: list(table.get(host, []))


def torchrun_env(master: str, world: int, local: int, **extra: str) -> dict[str, str]:
    return {
        "MASTER_ADDR": master,
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local),
        **extra,
    }


def test_debian_hosts_advertise_the_name_not_127_0_1_1() -> None:
    where = choose_channel_address(
        None,
        None,
        torchrun_env("node0", world=4, local=2),
        hostname="node0",
        resolve=fake_resolver(DEBIAN_HOSTS),
    )
    # Every interface, and the name: each worker resolves node0 for itself.
    assert (where.bind, where.advertise, where.why) == ("", "node0", "MASTER_ADDR")


def test_one_host_binds_and_advertises_loopback_only() -> None:
    for env in (
        torchrun_env("node0", world=4, local=4),  # torchrun --standalone: all ranks here
        {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "3"},  # no torchrun, store reached over loopback
        {"MASTER_ADDR": "localhost"},
    ):
        where = choose_channel_address(
            None, None, env, hostname="node0", resolve=fake_resolver(DEBIAN_HOSTS)
        )
        assert (where.bind, where.advertise) == ("127.0.0.1", "127.0.0.1"), env


def test_an_explicit_advertised_host_is_handed_out_as_given() -> None:
    where = choose_channel_address(
        None, "node0.cluster", torchrun_env("node0", 4, 2), hostname="node0"
    )
    assert (where.bind, where.advertise, where.why) == ("", "node0.cluster", "channel_advertise")
    # On one host too: then it must listen where that name leads, so on every interface.
    where = choose_channel_address(None, "node0.cluster", torchrun_env("node0", 2, 2))
    assert (where.bind, where.advertise) == ("", "node0.cluster")


def test_an_explicit_bind_address_is_advertised_unless_told_otherwise() -> None:
    env = torchrun_env("node0", 4, 2)
    where = choose_channel_address("10.0.0.1", None, env, resolve=fake_resolver({}))
    assert (where.bind, where.advertise) == ("10.0.0.1", "10.0.0.1")
    where = choose_channel_address("10.0.0.1", "node0", env, resolve=fake_resolver({}))
    assert (where.bind, where.advertise) == ("10.0.0.1", "node0")
    for wildcard in ("0.0.0.0", "::"):
        where = choose_channel_address(wildcard, None, env, resolve=fake_resolver(DEBIAN_HOSTS))
        assert (where.bind, where.advertise) == ("", "node0")


def test_rank_0s_node_may_set_the_addresses_in_its_environment_the_config_wins() -> None:
    env = torchrun_env(
        "node0", 4, 2, HAPI_CHANNEL_BIND="0.0.0.0", HAPI_CHANNEL_ADVERTISE="10.0.0.1"
    )
    assert choose_channel_address(None, None, env).advertise == "10.0.0.1"
    assert choose_channel_address(None, "node0-ib", env).advertise == "node0-ib"


@pytest.mark.parametrize(
    ("bind", "advertise", "message"),
    [
        (None, "127.0.0.1", "channel_advertise '127.0.0.1' is a loopback address"),
        (None, "localhost", "channel_advertise 'localhost' is a loopback address"),
        ("127.0.0.1", None, "bind address '127.0.0.1' is loopback here"),
        # The name resolves here to Debian's 127.0.1.1: binding it is what failed before.
        ("node0", None, r"bind address 'node0' is loopback here \(127.0.1.1\)"),
    ],
)
def test_loopback_for_workers_on_other_nodes_is_refused(
    bind: str | None, advertise: str | None, message: str
) -> None:
    with pytest.raises(ChannelError, match=message):
        choose_channel_address(
            bind, advertise, torchrun_env("node0", 4, 2), resolve=fake_resolver(DEBIAN_HOSTS)
        )


def test_a_loopback_master_addr_on_several_nodes_falls_back_to_the_host_name() -> None:
    # torch sets MASTER_ADDR to socket.getfqdn(), which is "localhost" where the host's name maps
    # to 127.0.0.1 (as on this test machine): a name that is loopback everywhere is never handed
    # out; the host's own name is, else an address it resolves to that is not loopback.
    env = {"MASTER_ADDR": "localhost", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    where = choose_channel_address(None, None, env, hostname="node0", resolve=fake_resolver({}))
    assert (where.bind, where.advertise) == ("", "node0")
    table = {"localhost": ["127.0.0.1", "10.0.0.7"]}
    where = choose_channel_address(
        None, None, env, hostname="localhost", resolve=fake_resolver(table)
    )
    assert where.advertise == "10.0.0.7"
    with pytest.raises(ChannelError, match="Set channel_advertise"):
        choose_channel_address(None, None, env, hostname="localhost", resolve=fake_resolver({}))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("ip6-localhost", True),
        ("app.localhost", True),
        ("node0", False),  # whatever it resolves to here: each host resolves it itself
        ("10.0.0.1", False),
        ("fd00::2", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize("value", ["node0:29500", "http://node0", "10.0.0.1:80", "node 0", ""])
def test_the_config_refuses_what_is_not_a_host(value: str) -> None:
    with pytest.raises(DistributedConfigError, match="host name or an IP address"):
        DistributedConfig(model="models/m", container="c", channel_advertise=value)


def test_the_cli_flags_reach_the_config() -> None:
    from hapi_cli.main import build_parser
    from hapi_cli.workers import config_from_args

    args = build_parser().parse_args(
        [
            "finetune",
            "--model",
            "models/efficientnet_lite0",
            "--container",
            "c",
            "--workers",
            "2",
            "--channel-bind",
            "0.0.0.0",
            "--channel-advertise",
            "node0.cluster",
        ]
    )
    config = config_from_args(args)
    assert (config.channel_bind, config.channel_advertise) == ("0.0.0.0", "node0.cluster")
    assert DistributedConfig.from_json(config.to_json()) == config


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # picks the default route's source; sends nothing
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if is_loopback_host(address) else address


def test_a_wildcard_channel_takes_workers_through_a_non_loopback_address() -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address (no default route)")
    token = os.urandom(32)
    with AggregatorChannel(2, token, host="", io_timeout_s=10) as aggregator:
        port = aggregator.address[1]
        with WorkerChannel((address, port), 1, 2, token, connect_timeout_s=10):
            aggregator.accept(timeout_s=30)
            assert aggregator.connected == [1]


def test_an_unreachable_name_says_what_it_resolves_to_here() -> None:
    name = socket.gethostname()
    found = resolve_host(name)
    if is_loopback_host(name) or not found:
        pytest.skip(f"this host's name {name!r} is loopback or does not resolve")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = sock.getsockname()[1]
        with pytest.raises(ChannelError) as failed:
            WorkerChannel((name, port), 1, 2, b"x" * 32, connect_timeout_s=0.2)
    assert f"{name} resolves here to {', '.join(found)}" in str(failed.value)


_RANK = """
import json, os, sys
import torch.distributed as dist
from hapi_client.distributed import DistributedConfig
from hapi_client.distributed import rendezvous

sent = []
real = rendezvous.WorkerChannel
rendezvous.WorkerChannel = lambda address, *a, **k: sent.append(address) or real(address, *a, **k)
dist.init_process_group("gloo")
config = DistributedConfig(model="models/m", container="c", channel_timeout_s=60)
aggregator, worker = rendezvous.open_channels(config, dist.get_rank(), dist.get_world_size())
dist.barrier()
if aggregator is not None:
    print(json.dumps({"connected": aggregator.connected}))
    aggregator.close()
else:
    print(json.dumps({"address": list(sent[0])}))
    worker.close()
dist.destroy_process_group()
"""


def test_two_ranks_that_claim_two_nodes_connect_by_a_name_that_is_loopback_on_rank_0(
    tmp_path: Path,
) -> None:
    """The issue's case through the real rendezvous: MASTER_ADDR is this host's name, which
    resolves here to a loopback address (Debian's 127.0.1.1; 127.0.0.1 on this test machine), and
    the ranks say they are on two nodes. Rank 0 advertises the name and listens on every
    interface; rank 1 resolves the name itself and connects."""
    name = socket.gethostname()
    if is_loopback_host(name) or not resolve_host(name):
        pytest.skip(f"this host's name {name!r} is loopback or does not resolve here")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = {
        **os.environ,
        "MASTER_ADDR": name,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "1",  # two nodes, one rank each
        "PYTHONPATH": str(ROOT),
        "GLOO_SOCKET_IFNAME": "lo",
    }
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**base, "RANK": str(rank), "LOCAL_RANK": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert outputs[0] == {"connected": [1]}
    host, advertised_port = outputs[1]["address"]
    assert host == name  # the name, not what it resolves to on rank 0
