"""In-proxy execution shares the proxy fairly: reads leave its hub free, every wait is bounded.

Against a real proxy, whose filter logs its markers (a read started or done, a slot asked
for or taken, a stream cut off) as syslog datagrams to this test: the order of events is read
from them, never from timing. The proxy's resident memory is sampled from ``/proc/PID/statm``
(``VmHWM`` can be reset by ``clear_refs`` and under-reads) and printed with the bystander's
latency (``-s`` shows them).
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from hapi_stack import RunningStack
from tests.swift_middleware.mw_support import MW_DATA, MwData, ProxyProcess, extract, shard_url

pytestmark = pytest.mark.swift

BIG = "big/object-64mib.bin"
SEND_TIMEOUT_S = 5
WAIT_S = 120  # the bound on every wait of this test for a marker


class Markers:
    """The filter's log lines, received as syslog datagrams on a UDP port of this process."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.lines: list[str] = []

    def drain(self) -> list[str]:
        """Every line received by now (those already read included)."""
        self.sock.setblocking(False)
        try:
            while True:
                self.lines.append(self.sock.recv(65536).decode(errors="replace"))
        except BlockingIOError:
            pass
        return self.lines

    def count(self, pattern: str, since: int = 0) -> int:
        """How many lines from the ``since``-th on match ``pattern``."""
        return len([x for x in self.drain()[since:] if re.search(pattern, x)])

    def wait_for(self, pattern: str, count: int = 1, since: int = 0) -> list[str]:
        """Block until ``count`` lines from the ``since``-th on match ``pattern`` (at most
        WAIT_S); the lines so far."""
        deadline = time.monotonic() + WAIT_S
        while self.count(pattern, since) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"no {count} x {pattern!r} in the proxy log: {self.lines[-20:]}"
            self.sock.setblocking(True)
            self.sock.settimeout(left)
            try:
                self.lines.append(self.sock.recv(65536).decode(errors="replace"))
            except TimeoutError:
                pass
        return self.lines


class RssPeak:
    """The peak resident memory of a process, sampled every 20 ms from ``/proc/PID/statm``."""

    def __init__(self, pid: int) -> None:
        self.path = f"/proc/{pid}/statm"
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.before = self._rss()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        with open(self.path) as statm:
            return int(statm.read().split()[1]) * self.page

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, self._rss())
            except OSError:  # the process ended
                return

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(5)
        return f"peak RSS {self.peak / 2**20:.0f} MiB (before {self.before / 2**20:.0f} MiB)"


@pytest.fixture(scope="module")
def markers() -> Iterator[Markers]:
    got = Markers()
    yield got
    got.sock.close()


@pytest.fixture(scope="module")
def waits_proxy(proxy_factory: Callable[..., ProxyProcess], markers: Markers) -> ProxyProcess:
    """In-proxy execution with 2 slots, two requests allowed to wait for one, a short send
    timeout, and the filter's debug log sent to :class:`Markers`."""
    return proxy_factory(
        execution="in_proxy",
        torch_threads="1",
        max_concurrent="2",
        queue_limit="2",
        request_timeout="300",
        send_timeout=str(SEND_TIMEOUT_S),
        # paste lets [DEFAULT] win over a section's own option unless it is ``set``.
        **{"set log_level": "DEBUG"},
        log_udp_host="127.0.0.1",
        log_udp_port=str(markers.port),
    )


def test_a_plain_get_completes_while_an_in_proxy_extraction_reads_a_large_object(
    waits_proxy: ProxyProcess, markers: Markers, mw_data: MwData, swift_stack: RunningStack
) -> None:
    conn = swift_stack.connection()
    conn.put_object(MW_DATA, BIG, os.urandom(64 * 2**20))
    conn.close()
    rss = RssPeak(waits_proxy.process.pid)
    answer: list[int] = []
    # Not a shard: the extraction is refused once the object is read, which is all it is for.
    extraction = threading.Thread(
        target=lambda: answer.append(
            extract(
                shard_url(waits_proxy, MW_DATA, BIG), mw_data.body("alexnet", 3), mw_data.headers()
            ).status
        )
    )
    extraction.start()
    try:
        markers.wait_for(f"HAPI read of {MW_DATA}/{BIG} started")
        start = time.perf_counter()
        get = httpx.get(shard_url(waits_proxy), headers={"X-Auth-Token": mw_data.token}, timeout=60)
        latency = time.perf_counter() - start
        # The proxy logs the read's end before it can answer anything after it.
        read_done_before_get = any(f"read of {MW_DATA}/{BIG} done" in x for x in markers.drain())
    finally:
        extraction.join(WAIT_S)
    markers.wait_for(f"HAPI read of {MW_DATA}/{BIG} done: {64 * 2**20} bytes")
    print(f"\nin-proxy read of 64 MiB: bystander GET {latency * 1000:.0f} ms, {rss.stop()}")
    assert get.status_code == 200 and len(get.content) > 0
    assert answer and answer[0] == 422, answer
    assert not read_done_before_get, "the plain GET was answered only after the read ended"


def _park(proxy: ProxyProcess, url_path: str, body: bytes, token: str) -> socket.socket:
    """A client that sends a HAPI request and never reads its answer (a tiny receive buffer)."""
    port = int(proxy.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = (
        f"POST {url_path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Hapi-Request: extract\r\n"
        f"X-Auth-Token: {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_clients_that_do_not_read_are_cut_off_and_requests_beyond_the_queue_get_503(
    waits_proxy: ProxyProcess, markers: Markers, mw_data: MwData
) -> None:
    rss = RssPeak(waits_proxy.process.pid)
    seen = len(markers.drain())
    # Streams far larger than the sockets' buffers: 12 samples of 64x112x112 float32 (3 MiB each).
    big = json.dumps(mw_data.body("resnet18", 1, side=224, b_max=1, output_dtype="float32"))
    path = shard_url(waits_proxy).removeprefix(waits_proxy.url)
    parked = [_park(waits_proxy, path, big.encode(), mw_data.token) for _ in range(2)]
    try:
        markers.wait_for("took a slot", count=2, since=seen)
        # Two more wait for a slot (queue_limit = 2: the scheduler's queue holds the two
        # parked requests while they plan their memory).
        waiting: list[int] = []

        def wait_in_line() -> None:
            body = mw_data.body("resnet18", 5)
            waiting.append(extract(shard_url(waits_proxy), body, mw_data.headers()).status)

        in_line = [threading.Thread(target=wait_in_line) for _ in range(2)]
        for thread in in_line:
            thread.start()
        markers.wait_for(r"asks for a slot \(2 of 2 busy", count=2, since=seen)
        refused = []
        for _ in range(3):
            start = time.perf_counter()
            got = extract(shard_url(waits_proxy), mw_data.body("resnet18", 5), mw_data.headers())
            refused.append((got, time.perf_counter() - start))
        cut_before_refusals = markers.count("cut off", seen)
        for thread in in_line:
            thread.join(WAIT_S)
        lines = markers.wait_for("cut off", count=2, since=seen)[seen:]
    finally:
        for sock in parked:
            sock.close()
    print(
        f"\nin-proxy queue: {len(refused)} refusals in "
        f"{', '.join(f'{s * 1000:.0f} ms' for _, s in refused)}; {rss.stop()}"
    )
    for got, _ in refused:
        assert got.status == 503, got.body
        answer = json.loads(got.body)
        assert answer["code"] == "queue_full" and "in-proxy slots are busy" in answer["detail"]
        assert got.headers["retry-after"] == "5"
    # Refused while the two non-readers still held both slots...
    assert cut_before_refusals == 0
    # ...who were cut off after the send timeout, which freed the slots for those waiting.
    assert waiting == [200, 200]
    cut = [i for i, x in enumerate(lines) if "cut off" in x]
    taken = [i for i, x in enumerate(lines) if "took a slot" in x]
    assert len(taken) == 4 and taken[2] > cut[0] and taken[3] > cut[0], lines
