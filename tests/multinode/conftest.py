"""Fixtures of the tests across simulated nodes (issue 22).

``cluster``: two nodes, ``node-a`` (10.77.0.1) and ``node-b`` (10.77.0.2), each in a network
namespace of its own joined by a veth pair, with Debian's hosts-file trap (a node's own name is
127.0.1.1 there); see :mod:`tests.multinode.cluster`. ``node_stack``: the real Swift + HAPI
server on ``node-a``, bound to every interface and advertised at 10.77.0.1, with the training
photos and EfficientNet-Lite0 uploaded *from node-b* (so the stack is known to serve the other
node). Without root or ``ip`` every test here skips, saying why.

Run torchrun jobs with :func:`tests.multinode.torchrun.run_torchrun` (every node at once) or
:func:`~tests.multinode.torchrun.start_torchrun` (one node, e.g. to kill and restart it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster import SimulatedCluster, cluster_support
from .stack import NodeStack, start_node_stack

#: 40 photos in 8 shards of 5: small enough for seconds per epoch on two cores.
TRAIN = "nodes-train"
TRAIN_SOURCE = "photos:train?per_class=4&size=96x72"
TRAIN_SAMPLES, SHARD_SIZE = 40, 5
MODEL = "models/efficientnet_lite0"


@pytest.fixture(scope="session")
def cluster() -> Iterator[SimulatedCluster]:
    reason = cluster_support()
    if reason is not None:
        pytest.skip(f"cannot simulate nodes with network namespaces here: {reason}")
    with SimulatedCluster.create(("node-a", "node-b")) as made:
        yield made


@pytest.fixture(scope="session")
def node_stack(
    cluster: SimulatedCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeStack]:
    node_a, node_b = cluster.nodes
    stack = start_node_stack(cluster, node_a, tmp_path_factory.mktemp("node-a-stack"))
    try:
        stack.upload(node_b, "model", "--arch", "efficientnet_lite0")
        stack.upload(
            node_b,
            "dataset",
            "--source",
            TRAIN_SOURCE,
            "--container",
            TRAIN,
            "--shard-size",
            str(SHARD_SIZE),
            "--no-progress",
        )
        yield stack
    finally:
        stack.stop()
