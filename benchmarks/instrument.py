"""Measuring a run from its parts: client hooks, a CPU/link sampler and the pipelined lower bound.

:class:`ClientProbe` wraps one :class:`hapi_client.HapiClient` (instance attributes only, the
library is untouched): at the first **dataset** access (a shard read, the bandwidth probe, a HAPI
request) it calls ``on_first_data`` (the benchmarks shape the link from there on, so downloading
the model, which a user caches, does not count) and waits at an optional barrier (simultaneous
tenants); it records the server's own timings of every extraction.

:class:`Sampler` reads, every few tens of milliseconds, the CPU seconds of this process and of the
storage side's processes and the link's byte counters, so that the costs of one epoch can be cut
out of a run afterwards. With each side pinned to its own cores, an epoch can take no less than
any of: the storage side's CPU time, the client's CPU time, the bytes moved over the link divided
by its rate. Their maximum is the pipelined lower bound. ALL_IN_COS does not pipeline (the
server trains, then returns the model): its bound adds the storage side's time and the transfer.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hapi_client import HapiClient
from hapi_contract import FinetuneMetrics

from .machine import cpu_seconds, process_cpu_seconds
from .shaping import Link

__all__ = ["ClientProbe", "ExtractRecord", "LowerBound", "Sample", "Sampler", "lower_bound"]


@dataclass(frozen=True)
class ExtractRecord:
    shard: str
    started: float
    seconds: float
    wire_bytes: int
    attempts: int
    cos_batch_sizes: list[int]
    server_ms: dict[str, float]


class ClientProbe:
    """Hooks on one client: first-data callback, start barrier, per-request server timings."""

    def __init__(
        self,
        client: HapiClient,
        *,
        models_container: str,
        on_first_data: Callable[[], None] | None = None,
        barrier: threading.Barrier | None = None,
    ) -> None:
        self.client = client
        self.models_container = models_container
        self.on_first_data = on_first_data
        self.barrier = barrier
        self.first_data_at: float | None = None
        self.first_load_at: float | None = None
        """When the first shard read or extraction began (the epoch's start; not the probe)."""
        self.extracts: list[ExtractRecord] = []
        self.finetune_meta: FinetuneMetrics | None = None
        self._lock = threading.Lock()
        self._wrap()

    def _first_data(self) -> None:
        with self._lock:
            if self.first_data_at is not None:
                return
            if self.on_first_data is not None:
                self.on_first_data()
            if self.barrier is not None:
                self.barrier.wait()
            self.first_data_at = time.perf_counter()

    def _loading(self) -> None:
        with self._lock:
            if self.first_load_at is None:
                self.first_load_at = time.perf_counter()

    def _wrap(self) -> None:
        swift, transport = self.client.swift, self.client.transport
        get, read_prefix = swift.get, swift.read_prefix
        extract, finetune = transport.extract, transport.finetune

        def get_hook(container: str, name: str, **kw: Any) -> Any:
            if container != self.models_container:
                self._first_data()
                self._loading()
            return get(container, name, **kw)

        def prefix_hook(*args: Any, **kw: Any) -> Any:
            # Bandwidth probes and the split rule's sample images: the first dataset bytes.
            self._first_data()
            return read_prefix(*args, **kw)

        def extract_hook(req: Any, num_samples: int | None = None) -> Any:
            self._first_data()
            self._loading()
            started = time.perf_counter()
            got = extract(req, num_samples=num_samples)
            meta = got.end.meta or {}
            record = ExtractRecord(
                shard=req.shard,
                started=started,
                seconds=time.perf_counter() - started,
                wire_bytes=got.wire_bytes,
                attempts=got.attempts,
                cos_batch_sizes=list(meta.get("cos_batch_sizes", [])),
                server_ms=dict(meta.get("server_ms", {})),
            )
            with self._lock:
                self.extracts.append(record)
            return got

        def finetune_hook(req: Any) -> Any:
            self._first_data()
            blob, meta = finetune(req)
            self.finetune_meta = meta
            return blob, meta

        # Instance attributes shadow the methods for this client only.
        setattr(swift, "get", get_hook)  # noqa: B010
        setattr(swift, "read_prefix", prefix_hook)  # noqa: B010
        setattr(transport, "extract", extract_hook)  # noqa: B010
        setattr(transport, "finetune", finetune_hook)  # noqa: B010

    def server_compute_s(self) -> float:
        """Decode + forward + encode seconds the server reported for this client's extractions."""
        total = 0.0
        for r in self.extracts:
            total += sum(r.server_ms.get(k, 0.0) for k in ("decode", "compute", "encode")) / 1e3
        return total


@dataclass(frozen=True)
class Sample:
    at: float
    client_cpu: float
    storage_cpu: float
    server_cpu: float
    rx: int
    tx: int


@dataclass
class Sampler:
    """A background thread sampling CPU seconds and link counters every ``interval`` seconds."""

    storage_pids: list[int]
    server_pid: int | None
    link: Link
    interval: float = 0.05
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def sample(self) -> Sample:
        counters = self.link.counters() or (0, 0)
        return Sample(
            at=time.perf_counter(),
            client_cpu=time.process_time(),
            storage_cpu=cpu_seconds(self.storage_pids),
            server_cpu=(process_cpu_seconds(self.server_pid) or 0.0) if self.server_pid else 0.0,
            rx=counters[0],
            tx=counters[1],
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(self.sample())

    def __enter__(self) -> Sampler:
        self.samples.append(self.sample())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.sample())

    def at(self, when: float) -> Sample:
        """The counters at ``when``, interpolated linearly between the two nearest samples."""
        if not self.samples:
            raise ValueError("no samples taken")
        times = [s.at for s in self.samples]
        i = bisect.bisect_left(times, when)
        if i <= 0:
            return self.samples[0]
        if i >= len(self.samples):
            return self.samples[-1]
        a, b = self.samples[i - 1], self.samples[i]
        w = (when - a.at) / max(b.at - a.at, 1e-9)

        def mix(x: float, y: float) -> float:
            return x + w * (y - x)

        return Sample(
            when,
            mix(a.client_cpu, b.client_cpu),
            mix(a.storage_cpu, b.storage_cpu),
            mix(a.server_cpu, b.server_cpu),
            round(mix(a.rx, b.rx)),
            round(mix(a.tx, b.tx)),
        )

    def between(self, start: float, end: float) -> Sample:
        """Differences of every counter over ``[start, end]`` (``at`` holds the duration)."""
        a, b = self.at(start), self.at(end)
        return Sample(
            end - start,
            b.client_cpu - a.client_cpu,
            b.storage_cpu - a.storage_cpu,
            b.server_cpu - a.server_cpu,
            b.rx - a.rx,
            b.tx - a.tx,
        )


@dataclass(frozen=True)
class LowerBound:
    """max(storage CPU, client CPU, bytes / rate) of one epoch, and what set it.

    ``sequential``: the storage side's work and the transfer cannot overlap (ALL_IN_COS trains
    the whole epoch on the server, then returns the model), so they add up.
    """

    storage_s: float
    client_s: float
    network_s: float
    sequential: bool = False

    @property
    def seconds(self) -> float:
        if self.sequential:
            return max(self.storage_s + self.network_s, self.client_s)
        return max(self.storage_s, self.client_s, self.network_s)

    @property
    def limiter(self) -> str:
        if self.sequential and self.storage_s + self.network_s >= self.client_s:
            return "server, then network"
        parts = {"server": self.storage_s, "client": self.client_s, "network": self.network_s}
        return max(parts, key=lambda k: parts[k])


def lower_bound(
    storage_cpu_s: float,
    client_cpu_s: float,
    nbytes: int,
    rate_bytes_per_s: float,
    *,
    sequential: bool = False,
) -> LowerBound:
    """The lower bound of an epoch from its measured parts (pipelined unless ``sequential``)."""
    return LowerBound(
        storage_cpu_s,
        client_cpu_s,
        nbytes / rate_bytes_per_s if rate_bytes_per_s > 0 else 0.0,
        sequential,
    )
