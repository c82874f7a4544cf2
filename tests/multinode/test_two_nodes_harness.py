"""The simulated-node harness itself: what it makes, what it leaves behind, when it skips."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hapi_bench import NETNS_ETC, ShapingError, add_named_netns, netns_path

from .cluster import SimulatedCluster, cluster_support


def test_without_root_the_cluster_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = cluster_support()
    assert reason is not None and reason.startswith("not root")


@pytest.fixture
def fresh_cluster() -> Iterator[SimulatedCluster]:
    """A cluster of this test's own (the session's ``cluster`` must outlive every test)."""
    reason = cluster_support()
    if reason is not None:
        pytest.skip(f"cannot simulate nodes with network namespaces here: {reason}")
    cluster = SimulatedCluster.create(("node-a", "node-b"), tag=f"h{os.getpid()}")
    yield cluster
    cluster.close()  # a second close does nothing


def test_nodes_have_their_own_names_addresses_and_hosts_files(
    fresh_cluster: SimulatedCluster,
) -> None:
    cluster = fresh_cluster
    a, b = cluster.nodes
    assert (a.address, b.address) == ("10.77.0.1", "10.77.0.2")
    assert cluster.run(b, ["hostname"]).stdout.strip() == "node-b"
    # Debian's trap: a node's own name is loopback there, a link address everywhere else.
    assert cluster.resolve(a, "node-a") == ["127.0.1.1"]
    assert cluster.resolve(b, "node-a") == ["10.77.0.1"]
    assert cluster.resolve(a, "node-b") == ["10.77.0.2"]
    # node-b reaches node-a over the link: bash's /dev/tcp is refused (nothing listens on
    # port 9), not unreachable.
    probe = cluster.run(b, ["bash", "-c", "exec 3<>/dev/tcp/10.77.0.1/9"], check=False)
    assert "refused" in probe.stderr
    # This process's own /etc/hosts is untouched.
    assert "10.77.0.1" not in Path("/etc/hosts").read_text()


def test_close_stops_its_processes_and_removes_exactly_what_it_made(
    fresh_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    cluster = fresh_cluster
    names = [node.netns for node in cluster.nodes]
    proc = cluster.start(cluster.nodes[1], ["sleep", "600"], log_path=tmp_path / "sleep.log")
    # A name already taken is refused, not adopted (and so never deleted by this cluster).
    with pytest.raises(ShapingError, match="exists"):
        add_named_netns(names[0])
    assert all(netns_path(name).exists() for name in names)
    assert all((NETNS_ETC / name / "hosts").is_file() for name in names)
    cluster.close()
    assert proc.popen.poll() is not None
    assert not any(netns_path(name).exists() for name in names)
    assert not any((NETNS_ETC / name).exists() for name in names)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert not any(name in listed.stdout for name in names)
