"""A client link limited to a rate: tc in private network namespaces, else a token bucket.

**netns** (root, ``unshare``, ``nsenter``, ``ip`` and ``tc`` available): the client runs in one
private network namespace and Swift + the HAPI server in another, joined by a veth pair
(``10.231.0.1`` client, ``10.231.0.2`` storage). An htb class on each end limits each direction to
the rate, so every byte between client and storage (HAPI streams, BASELINE's shard downloads,
the requests) crosses a shaped link, while the HAPI server reads Swift over the storage
namespace's own loopback, unshaped: the thesis' storage network. Two namespaces rather than one
with two loopback addresses, because the HAPI server accepts only storage URLs under its own
Swift URL, so client and server must reach Swift at the same address. Nothing is left behind:
the namespaces (and the veth with them) vanish with their last process. htb rather than tbf:
tbf on a 64 KiB-MTU loopback stalls TCP unless its burst is >= 256 KiB (machine notes, section 4).

**throttle** (fallback): a token bucket inside the client (:class:`hapi_client.TokenBucket`)
holds back every response body the client reads. It limits only what this process receives.

Either way the rate is checked by a short TCP transfer from the storage side
(:func:`measure_rate`), recorded next to the target, and flagged when more than 10 % off.
"""

from __future__ import annotations

import functools
import logging
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from .netns import VethEnd, add_veth_pair, netns_support, run_in

if TYPE_CHECKING:  # hapi_client imports torch: the storage agent has no use for it
    from hapi_client import HapiClient, TokenBucket

__all__ = [
    "CLIENT_ADDR",
    "CLIENT_IFACE",
    "STORAGE_ADDR",
    "STORAGE_IFACE",
    "TOLERANCE",
    "ByteSource",
    "Link",
    "LinkCheck",
    "NetnsLink",
    "ThrottleLink",
    "mbit_to_bytes",
    "measure_rate",
    "shaping_support",
]

log = logging.getLogger(__name__)

CLIENT_IFACE = "hapi-c0"
STORAGE_IFACE = "hapi-s0"
CLIENT_ADDR = "10.231.0.1"
STORAGE_ADDR = "10.231.0.2"
_PREFIX = 24
#: The htb rate of an "unshaped" link: far above what the two sides can move on a few cores.
_OPEN_MBIT = 20_000.0
#: A run whose measured rate is further than this (relative) from the target is flagged.
TOLERANCE = 0.10
_CHUNK = 256 * 1024


def mbit_to_bytes(mbit: float) -> float:
    """Megabits per second to bytes per second."""
    return mbit * 1e6 / 8


@functools.cache
def shaping_support() -> str | None:
    """None when tc shaping in private network namespaces works here, else why not.

    Checked by doing it once: a throwaway namespace with a veth pair and an htb qdisc.
    """
    reason = netns_support(("unshare", "nsenter", "ip", "tc"))
    if reason is not None:
        return reason
    probe = (
        "ip link set lo up && ip link add hapi-p0 type veth peer name hapi-p1 && "
        "tc qdisc add dev hapi-p0 root handle 1: htb default 10 && "
        "tc class add dev hapi-p0 parent 1: classid 1:10 htb rate 100mbit"
    )
    done = subprocess.run(
        ["unshare", "-n", "--", "sh", "-c", probe], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return f"a private network namespace with veth + htb failed: {(done.stdout + done.stderr).strip()}"
    return None


class Link(Protocol):
    """The client's link to the storage side."""

    kind: str
    method: str

    @property
    def rate_mbit(self) -> float | None: ...

    def set_rate(self, mbit: float | None) -> None:
        """Limit the link to ``mbit`` Mbit/s each way; None lifts the limit."""

    def attach(self, client: HapiClient) -> None:
        """Route ``client``'s transfers through the link (a no-op where the kernel does it)."""

    def counters(self) -> tuple[int, int] | None:
        """Bytes received and sent by the client side so far, where the link counts them."""


def _htb_burst(mbit: float) -> str:
    # 2 ms worth of bytes, at least 64 KiB: a burst below a GSO super-packet stalls htb; a long
    # one lets short transfers run far above the rate.
    return f"{max(64 * 1024, int(mbit_to_bytes(mbit) * 0.002))}b"


class NetnsLink:
    """A veth pair from this process's namespace to the one of ``peer_pid``, htb on both ends."""

    kind = "netns"
    method = "tc htb on a veth pair between two private network namespaces (client | Swift + HAPI server)"

    def __init__(self, peer_pid: int) -> None:
        self.peer_pid = peer_pid
        self._rate: float | None = None

    @classmethod
    def create(cls, peer_pid: int) -> NetnsLink:
        """Build the pair: this end is ``CLIENT_ADDR``, the peer's ``STORAGE_ADDR``; unshaped."""
        link = cls(peer_pid)
        add_veth_pair(
            VethEnd(CLIENT_IFACE, CLIENT_ADDR),
            VethEnd(STORAGE_IFACE, STORAGE_ADDR, peer_pid),
            _PREFIX,
        )
        for iface, pid in ((CLIENT_IFACE, None), (STORAGE_IFACE, peer_pid)):
            run_in(
                [
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    iface,
                    "root",
                    "handle",
                    "1:",
                    "htb",
                    "default",
                    "10",
                ],
                pid,
            )
            run_in(link._class_command("add", iface, _OPEN_MBIT), pid)
        log.info(
            "veth %s (%s) <-> %s (%s, pid %d's namespace)",
            CLIENT_IFACE,
            CLIENT_ADDR,
            STORAGE_IFACE,
            STORAGE_ADDR,
            peer_pid,
        )
        return link

    @staticmethod
    def _class_command(action: str, iface: str, mbit: float) -> list[str]:
        rate = f"{mbit:g}mbit"
        burst = _htb_burst(mbit)
        return [
            "tc",
            "class",
            action,
            "dev",
            iface,
            "parent",
            "1:",
            "classid",
            "1:10",
            "htb",
            "rate",
            rate,
            "ceil",
            rate,
            "burst",
            burst,
            "cburst",
            burst,
        ]

    @property
    def rate_mbit(self) -> float | None:
        return self._rate

    def set_rate(self, mbit: float | None) -> None:
        if mbit is not None and mbit <= 0:
            raise ValueError("rate must be positive")
        if mbit == self._rate:
            return
        value = _OPEN_MBIT if mbit is None else mbit
        run_in(self._class_command("change", CLIENT_IFACE, value))
        run_in(self._class_command("change", STORAGE_IFACE, value), self.peer_pid)
        self._rate = mbit
        log.info("link rate: %s", "unshaped" if mbit is None else f"{mbit:g} Mbit/s")

    def attach(self, client: HapiClient) -> None:
        return None  # the kernel shapes every socket of this namespace

    def counters(self) -> tuple[int, int] | None:
        # /proc/self/net is this process's namespace; /sys/class/net is the mounter's.
        for line in Path("/proc/self/net/dev").read_text().splitlines():
            name, sep, rest = line.partition(":")
            if sep and name.strip() == CLIENT_IFACE:
                fields = rest.split()
                return int(fields[0]), int(fields[8])
        return None


class _SwitchableThrottle:
    """Duck-types :class:`hapi_client.TokenBucket`: one bucket, replaced when the rate changes."""

    def __init__(self) -> None:
        self._bucket: TokenBucket | None = None
        self.received = 0
        self._lock = threading.Lock()

    def set_rate(self, bytes_per_s: float | None) -> None:
        from hapi_client import TokenBucket

        self._bucket = TokenBucket(bytes_per_s) if bytes_per_s else None

    def consume(self, nbytes: int) -> None:
        with self._lock:
            self.received += nbytes
        bucket = self._bucket
        if bucket is not None:
            bucket.consume(nbytes)


class ThrottleLink:
    """The fallback: one client-side token bucket shared by every client of the testbed."""

    kind = "throttle"
    method = "client-side token bucket (hapi_client.TokenBucket) on every body the client reads"

    def __init__(self) -> None:
        self._throttle = _SwitchableThrottle()
        self._rate: float | None = None

    @property
    def rate_mbit(self) -> float | None:
        return self._rate

    @property
    def bucket(self) -> TokenBucket:
        """What to hand to code that takes a TokenBucket (it only calls ``consume``)."""
        return cast("TokenBucket", self._throttle)

    def set_rate(self, mbit: float | None) -> None:
        if mbit is not None and mbit <= 0:
            raise ValueError("rate must be positive")
        self._throttle.set_rate(None if mbit is None else mbit_to_bytes(mbit))
        self._rate = mbit

    def attach(self, client: HapiClient) -> None:
        client.throttle = self.bucket
        client.swift.throttle = self.bucket
        client.transport.throttle = self.bucket

    def counters(self) -> tuple[int, int] | None:
        return self._throttle.received, 0


class ByteSource:
    """The far end of a rate probe: a TCP server sending zeros to each client until it closes."""

    def __init__(self, host: str, port: int = 0) -> None:
        self._server = socket.create_server((host, port))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="byte-source", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.getsockname()[:2]
        return str(host), int(port)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._send, args=(conn,), daemon=True).start()

    @staticmethod
    def _send(conn: socket.socket) -> None:
        chunk = bytes(_CHUNK)
        with conn:
            try:
                while True:
                    conn.sendall(chunk)
            except OSError:
                return  # the prober closed the connection

    def close(self) -> None:
        self._stop.set()
        self._server.close()


@dataclass(frozen=True)
class LinkCheck:
    """The rate a short transfer measured against the target, with the verdict."""

    kind: str
    method: str
    target_mbit: float | None
    measured_mbit: float
    nbytes: int
    seconds: float

    @property
    def off_by(self) -> float | None:
        """Relative difference from the target (None when unshaped)."""
        if self.target_mbit is None:
            return None
        return (self.measured_mbit - self.target_mbit) / self.target_mbit

    @property
    def flagged(self) -> bool:
        """True when the measured rate is more than :data:`TOLERANCE` off the target."""
        off = self.off_by
        return off is not None and abs(off) > TOLERANCE

    def describe(self) -> str:
        target = "unshaped" if self.target_mbit is None else f"target {self.target_mbit:g} Mbit/s"
        text = f"{self.kind} ({target}, measured {self.measured_mbit:.1f} Mbit/s)"
        if self.flagged:
            text += f" FLAGGED: {100 * (self.off_by or 0):+.0f}% off the target"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "off_by": self.off_by, "flagged": self.flagged}


def measure_rate(
    address: tuple[str, int],
    *,
    seconds: float = 1.0,
    warmup_s: float = 0.25,
    consume: Callable[[int], None] | None = None,
) -> tuple[int, float]:
    """Read from a :class:`ByteSource` for ``warmup_s + seconds``; (bytes, seconds) after warm-up.

    The warm-up leaves out TCP slow start and the shaper's initial burst. ``consume`` sees every
    chunk read (the throttle of the fallback link).
    """
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with socket.create_connection(address, timeout=30) as sock:
        start = time.perf_counter()
        measured_from: float | None = None
        total = 0
        while True:
            n = sock.recv_into(view)
            if n == 0:
                break
            if consume is not None:
                consume(n)
            now = time.perf_counter()
            if measured_from is None:
                if now - start >= warmup_s:
                    measured_from = now
                continue
            total += n
            if now - measured_from >= seconds:
                return total, now - measured_from
    raise ConnectionError(f"the byte source at {address} closed the connection early")
