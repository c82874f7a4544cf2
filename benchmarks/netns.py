"""Network namespaces and veth pairs: the plumbing of the shaped testbed and of simulated nodes.

A namespace is named by a :data:`NetnsRef`: ``None`` for this process's own, a PID for the one a
running process holds (the testbed's ``unshare -n`` children: such a namespace vanishes with its
last process), or a name made by :func:`add_named_netns` (``ip netns add``: it lives until
:func:`delete_named_netns`, and ``ip netns exec NAME`` bind-mounts the files under
``/etc/netns/NAME/`` over their ``/etc`` counterparts, so a namespace can have its own
``/etc/hosts``, as a separate machine would).

::

    add_named_netns("node-a", files={"hosts": "127.0.1.1 node-a\\n"})
    add_named_netns("node-b")
    add_veth_pair(VethEnd("eth0", "10.77.0.1", "node-a"), VethEnd("eth0", "10.77.0.2", "node-b"))
    run_in(["ip", "addr"], "node-a")
    delete_named_netns("node-a")   # the veth goes with it
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ShapingError

__all__ = [
    "NETNS_ETC",
    "NetnsRef",
    "VethEnd",
    "add_named_netns",
    "add_veth_pair",
    "delete_named_netns",
    "netns_path",
    "netns_support",
    "run_in",
]

log = logging.getLogger(__name__)

#: ``None``: this process's namespace; an int: the namespace of that PID; a str: an ``ip netns`` name.
NetnsRef = int | str | None

#: Where ``ip netns exec NAME`` finds the files it bind-mounts over ``/etc`` (iproute2's NETNS_ETC_DIR).
NETNS_ETC = Path("/etc/netns")
_NETNS_RUN = Path("/run/netns")


def netns_path(netns: int | str) -> Path:
    """The file that holds the namespace (what ``nsenter --net=`` takes)."""
    if isinstance(netns, int):
        return Path(f"/proc/{netns}/ns/net")
    return _NETNS_RUN / netns


def run_in(command: list[str], netns: NetnsRef = None) -> str:
    """Run ``command`` in the namespace ``netns`` and return its stdout; ShapingError on failure."""
    if netns is not None:
        command = ["nsenter", f"--net={netns_path(netns)}", "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise ShapingError(command, done.stdout + done.stderr)
    return done.stdout


def netns_support(tools: Iterable[str] = ("ip", "nsenter")) -> str | None:
    """None when this process may make network namespaces with ``tools``, else why not."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_NET_ADMIN"
    for tool in tools:
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


@dataclass(frozen=True)
class VethEnd:
    """One end of a veth pair: its interface name, its IPv4 address and its namespace."""

    iface: str
    address: str
    netns: NetnsRef = None


def _in(netns: NetnsRef) -> list[str]:
    return [] if netns is None else ["netns", str(netns)]


def add_veth_pair(left: VethEnd, right: VethEnd, prefix: int = 24) -> None:
    """Join two namespaces: a veth pair, each end with its address and up.

    Each end is made in its own namespace directly, so both may carry the same name (``eth0``).
    The namespaces' loopback is brought up too: a fresh namespace's is down.
    """
    run_in(
        [
            "ip",
            "link",
            "add",
            left.iface,
            *_in(left.netns),
            "type",
            "veth",
            "peer",
            "name",
            right.iface,
            *_in(right.netns),
        ]
    )
    for end in (left, right):
        run_in(["ip", "link", "set", "lo", "up"], end.netns)
        run_in(["ip", "addr", "add", f"{end.address}/{prefix}", "dev", end.iface], end.netns)
        run_in(["ip", "link", "set", end.iface, "up"], end.netns)
    log.info(
        "veth %s (%s, namespace %s) <-> %s (%s, namespace %s)",
        left.iface,
        left.address,
        left.netns if left.netns is not None else "own",
        right.iface,
        right.address,
        right.netns if right.netns is not None else "own",
    )


def add_named_netns(name: str, files: Mapping[str, str] | None = None) -> None:
    """``ip netns add NAME``; ``files`` (e.g. ``{"hosts": ...}``) go to ``/etc/netns/NAME/``.

    ShapingError when the name is taken: a namespace is never adopted, so deleting it later
    removes only what this call made.
    """
    if netns_path(name).exists():
        raise ShapingError(["ip", "netns", "add", name], "a network namespace of that name exists")
    etc = NETNS_ETC / name
    if files:
        etc.mkdir(parents=True, exist_ok=False)
        for filename, text in files.items():
            (etc / filename).write_text(text)
    try:
        run_in(["ip", "netns", "add", name])
    except ShapingError:
        shutil.rmtree(etc, ignore_errors=True)
        raise


def delete_named_netns(name: str) -> None:
    """Delete a namespace made by :func:`add_named_netns`, its veth ends and its ``/etc`` files.

    Stop the processes inside it first: a namespace a process still holds outlives its name.
    """
    etc = NETNS_ETC / name
    try:
        if netns_path(name).exists():
            run_in(["ip", "netns", "delete", name])
    finally:
        if etc.is_dir():
            shutil.rmtree(etc)
