"""The real stack on one simulated node, serving the others over the link.

``hapi stack up --host 0.0.0.0 --advertise-host <the node's address>`` in the node's namespace
(a fresh namespace: the default ports are free), exactly as an operator would on a cluster's
storage node; ``hapi stack down`` stops its processes by PID. Clients on every node use
:attr:`NodeStack.auth_url` and :attr:`NodeStack.hapi_url`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hapi_client import SwiftCredentials
from hapi_stack import ADMIN_USER

from .cluster import Node, SimulatedCluster

__all__ = ["HAPI", "NodeStack", "start_node_stack"]

#: The ``hapi`` command of this virtual environment.
HAPI = str(Path(sys.executable).with_name("hapi"))
PROXY_PORT, HAPI_PORT = 8080, 8090


@dataclass(frozen=True)
class NodeStack:
    """A stack started by :func:`start_node_stack`."""

    cluster: SimulatedCluster
    node: Node
    state_dir: Path

    @property
    def auth_url(self) -> str:
        return f"http://{self.node.address}:{PROXY_PORT}/auth/v1.0"

    @property
    def hapi_url(self) -> str:
        return f"http://{self.node.address}:{HAPI_PORT}"

    @property
    def credentials(self) -> SwiftCredentials:
        return SwiftCredentials(self.auth_url, ADMIN_USER.name, ADMIN_USER.key)

    def swift_env(self) -> dict[str, str]:
        """``ST_AUTH``/``ST_USER``/``ST_KEY``: what the CLI and the workers read credentials from."""
        return {"ST_AUTH": self.auth_url, "ST_USER": ADMIN_USER.name, "ST_KEY": ADMIN_USER.key}

    def log(self, service: str) -> Path:
        """A service's log (``hapi-server``, ``proxy``, ...)."""
        return self.state_dir / "logs" / f"{service}.log"

    def log_mark(self, service: str) -> int:
        """Where the service's log ends now: :meth:`log_since` reads what comes after."""
        path = self.log(service)
        return path.stat().st_size if path.exists() else 0

    def log_since(self, service: str, mark: int) -> str:
        with self.log(service).open("rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")

    def upload(self, from_node: Node, *args: str) -> str:
        """``hapi upload ARGS`` run on ``from_node`` against this stack; its output."""
        done = self.cluster.run(
            from_node, [HAPI, "upload", *args], env=self.swift_env(), timeout=300
        )
        return done.stdout + done.stderr

    def stop(self) -> None:
        self.cluster.run(self.node, [HAPI, "stack", "down", "--state-dir", str(self.state_dir)])


def start_node_stack(cluster: SimulatedCluster, node: Node, state_dir: Path) -> NodeStack:
    """Swift + the HAPI server on ``node``, bound to every interface, advertised at its address."""
    stack = NodeStack(cluster, node, state_dir)
    command = [HAPI, "stack", "up", "--state-dir", str(state_dir), "--host", "0.0.0.0"]
    command += ["--advertise-host", node.address]
    try:
        cluster.run(node, command, timeout=180)
    except BaseException:
        # A partial start leaves recorded PIDs behind: stop them too.
        cluster.run(node, [HAPI, "stack", "down", "--state-dir", str(state_dir)], check=False)
        raise
    return stack
