"""``adaptation``: batch adaptation on and off under a memory budget (Fig 5.13, Table 5.4).

The thesis forced the COS batch to the whole request (1000 images) and sent 1..8 parallel POSTs to
two 16 GB GPUs: up to 6 fitted; beyond, batch adaptation (BA) cut COS batches and without it the
GPUs ran out of memory. A CPU server has no device memory to run out of, so the budget is made
real: the HAPI server process gets an address-space limit for its data (``RLIMIT_DATA``, set with
``prlimit`` after warm-up) of ``budget`` bytes above what it holds idle, and glibc is told to
return large blocks at once (``MALLOC_MMAP_THRESHOLD_``), so an allocation over the budget fails
inside the request (``DefaultCPUAllocator: can't allocate memory``: a 507 error frame) exactly as
a CUDA allocation would. The budget is 6.5 times the measured peak of one full request, so that
six fit and seven do not, as in the thesis. With BA on, the server plans against the same budget
(its ``cpu_memory_budget_bytes``, plus the resident weights; no framework reserve).

Each server first serves ``CALIBRATION`` lone requests: a CPU server measures the peak host memory
of a batch whose request runs alone and corrects its per-sample estimate from those readings
(:class:`hapi_core.host_memory.HostMemoryProbe`), as a GPU server does from CUDA's statistics. The
probe samples the server's resident memory for those readings (it never resets ``VmHWM``); every
point's requests report how many readings they made (``vmhwm_resets`` of the end frame).

Per point (k parallel requests of one shard each, AlexNet up to its freeze index, b_max = the
shard): completed requests, out-of-memory failures, the server's peak resident memory above idle
(``/proc/PID/statm`` sampled every 2 ms: resetting ``VmHWM`` through ``clear_refs`` made every
other reader's peak under-read) and its peak ``VmData`` above idle (polled:
the unit the budget is enforced in; a block counts there from its allocation, in the RSS only
once written), each as a share of the budget, the share of requests whose COS batch was cut and
the average cut, the solver's decision time and the most memory it planned for running requests
at once (both from the server's metrics; the planned share is what batch adaptation fills, the
measured shares are lower because concurrent requests do not peak at the same moment).
"""

from __future__ import annotations

import logging
import resource
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import hapi_models
import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

from hapi_client import StoredModel
from hapi_contract import API_PREFIX, ExtractRequest, FrameError, RemoteStreamError, TransformSpec
from hapi_contract.frames import FrameDecoder
from hapi_core.host_memory import resident_bytes

from .data import DatasetReady, ensure_photos_and_models
from .errors import ScenarioError
from .plots import plot_adaptation
from .results import ResultSet
from .testbed import Testbed

__all__ = ["Outcome", "run_adaptation"]

log = logging.getLogger(__name__)

ARCH = "alexnet"
SHARD = 100
HEADROOM = 6.5  # full requests that fit in the budget (the thesis saw 6 fit, 7 not)
CALIBRATION = 5  # lone requests before the points: over the server's 4 readings per head
_MALLOC_ENV = {
    # Fixed thresholds: blocks above 128 KiB are mmap'd and unmapped on free, so the data limit
    # tracks what requests hold now, not what the allocator kept from earlier ones.
    "MALLOC_MMAP_THRESHOLD_": "131072",
    "MALLOC_TRIM_THRESHOLD_": "131072",
    "MALLOC_ARENA_MAX": "2",
}


@dataclass
class Outcome:
    """How one extraction request ended."""

    status: int
    detail: str = ""
    cos_batch_sizes: list[int] = field(default_factory=list)
    planned_batch: int | None = None
    vmhwm_resets: int = 0
    """Batches the server's memory probe measured while serving this request."""

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def oom(self) -> bool:
        # The server answers 507 (insufficient_memory) for memory that ran out, chosen by type
        # (torch.OutOfMemoryError, MemoryError), before the stream or inside it.
        return self.status == 507


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1]) * 1024
    raise ScenarioError(f"/proc/{pid}/status has no {name}")


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> Outcome:
    decoder = FrameDecoder()
    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=600) as resp:
            planned = resp.headers.get("x-hapi-cos-batch-size")
            if resp.status_code != 200:
                resp.read()
                return Outcome(resp.status_code, resp.text[:300])
            for chunk in resp.iter_bytes():
                decoder.feed(chunk)
        end = decoder.close()
    except RemoteStreamError as exc:
        return Outcome(exc.status, exc.detail, planned_batch=int(planned) if planned else None)
    except (httpx.HTTPError, FrameError) as exc:
        return Outcome(0, f"{type(exc).__name__}: {exc}")
    meta = end.meta or {}
    sizes = list(meta.get("cos_batch_sizes", []))
    resets = int(meta.get("vmhwm_resets", 0))
    return Outcome(200, "", sizes, int(planned) if planned else None, resets)


def _server_metric(hapi_url: str, name: str) -> float | None:
    text = httpx.get(f"{hapi_url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def _decision_totals(hapi_url: str) -> tuple[float, float]:
    text = httpx.get(f"{hapi_url}/metrics", timeout=30).text
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hapi_adaptation_decision_seconds_sum":
                total += sample.value
            elif sample.name == "hapi_adaptation_decision_seconds_count":
                count += sample.value
    return total, count


class _Requester:
    """Fires k identical extraction requests at once, as k clients would."""

    def __init__(self, testbed: Testbed, stored: StoredModel, container: str, shard: str) -> None:
        with testbed.client() as client:
            storage_url, token = client.swift.auth()
        self.url = f"{testbed.stack.hapi_url}{API_PREFIX}/extract"
        self.headers = {"X-Auth-Token": token, "X-Storage-Url": storage_url}
        spec = hapi_models.get_spec(stored.arch)
        t = spec.transform
        self.request = ExtractRequest(
            container=container,
            shard=shard,
            model=stored.ref(),
            split_index=spec.default_freeze_index,
            transform=TransformSpec(resize=t.resize, crop=t.crop, mean=t.mean, std=t.std),
            b_max=SHARD,
        )

    def fire(self, k: int, split_index: int | None = None) -> list[Outcome]:
        body = self.request.model_dump(mode="json")
        if split_index is not None:
            body["split_index"] = split_index
        outcomes: list[Outcome | None] = [None] * k

        def one(i: int) -> None:
            outcomes[i] = _post(self.url, body, self.headers)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [o for o in outcomes if o is not None]


def _weights_bytes(arch: str) -> int:
    with torch.device("meta"):
        model = hapi_models.get_spec(arch).builder(1000, False)
    return sum(p.numel() * p.element_size() for p in [*model.parameters(), *model.buffers()])


def _calibrate(requester: _Requester, testbed: Testbed) -> dict[str, Any]:
    """Lone requests until the server's probe has its readings of the head (one per request);
    the planned COS batch and the measured peak of the last one."""
    outcomes = [requester.fire(1)[0] for _ in range(CALIBRATION)]
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise ScenarioError(f"calibration request failed: {failed[0].status} {failed[0].detail}")
    if outcomes[-1].vmhwm_resets:
        raise ScenarioError("the server still measures after the calibration requests")
    peak = _server_metric(testbed.stack.hapi_url, "hapi_measured_peak_memory_bytes")
    return {
        "readings": sum(o.vmhwm_resets for o in outcomes),
        "measured_peak_bytes": peak,
        "planned_batch": outcomes[-1].planned_batch,
    }


def _measure_one(requester: _Requester, pid: int) -> int:
    """Peak resident bytes above idle of one full request, on an unlimited server."""
    idle = _status_field(pid, "VmRSS")
    with _RssPeak(pid) as rss:
        outcome = requester.fire(1)[0]
    if not outcome.ok:
        raise ScenarioError(f"calibration request failed: {outcome.status} {outcome.detail}")
    return int(rss.peak) - idle


class _PeakPoller:
    """The largest value ``read()`` returned, polled every ``interval_s`` in a thread until the
    block ends or the source is gone (``read`` returns None)."""

    def __init__(self, read: Callable[[], float | None], interval_s: float, name: str) -> None:
        self._read = read
        self.interval_s = interval_s
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self._read()
            if value is None:
                return
            self.peak = max(self.peak, value)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


class _DataPeak(_PeakPoller):
    """The server's peak ``VmData`` (what RLIMIT_DATA limits), polled every ``interval_s``.

    The kernel keeps no high-water mark of ``VmData``, so it is polled; a request's blocks live
    for hundreds of milliseconds (a decoded batch, a layer's output), far longer than the
    interval, so the peak is seen within the allocations made between two polls.
    """

    def __init__(self, pid: int, interval_s: float = 0.002) -> None:
        self.pid = pid
        super().__init__(self._vmdata, interval_s, "vmdata-poll")

    def _vmdata(self) -> float | None:
        try:
            return _status_field(self.pid, "VmData")
        except (OSError, ScenarioError):
            return None  # the server is gone


class _RssPeak(_PeakPoller):
    """The server's peak resident memory, sampled from ``/proc/PID/statm`` every
    ``interval_s`` (``VmHWM`` is left alone, so any other reader's peak stays whole)."""

    def __init__(self, pid: int, interval_s: float = 0.002) -> None:
        self.pid = pid
        super().__init__(self._rss, interval_s, "rss-poll")

    def _rss(self) -> float | None:
        value = resident_bytes(self.pid)
        return float(value) if value else None  # 0: the server is gone


class _PlannedPeak(_PeakPoller):
    """The highest memory the server's planner held for running requests during a point.

    Read from its ``hapi_planned_memory_bytes`` gauge every ``interval_s``: a reservation lasts
    a whole request (seconds), so a coarse poll sees every plan, at little cost to the server.
    """

    def __init__(self, hapi_url: str, interval_s: float = 0.1) -> None:
        self.hapi_url = hapi_url
        super().__init__(self._planned, interval_s, "planned-poll")

    def _planned(self) -> float | None:
        try:
            return _server_metric(self.hapi_url, "hapi_planned_memory_bytes") or 0.0
        except httpx.HTTPError:
            return None  # the server is gone


def _point(
    requester: _Requester, testbed: Testbed, pid: int, k: int, adaptive: bool
) -> dict[str, Any]:
    idle = _status_field(pid, "VmRSS")
    idle_data = _status_field(pid, "VmData")
    before = _decision_totals(testbed.stack.hapi_url)
    started = time.perf_counter()
    with (
        _DataPeak(pid) as data_peak,
        _RssPeak(pid) as rss,
        _PlannedPeak(testbed.stack.hapi_url) as planned,
    ):
        outcomes = requester.fire(k)
    seconds = time.perf_counter() - started
    alive = Path(f"/proc/{pid}").exists()
    peak = int(rss.peak) - idle if alive else None
    after = _decision_totals(testbed.stack.hapi_url) if alive else before
    done = [o for o in outcomes if o.ok]
    cuts = [
        1 - max(o.cos_batch_sizes) / SHARD
        for o in done
        if o.cos_batch_sizes and max(o.cos_batch_sizes) < SHARD
    ]
    decisions = after[1] - before[1]
    return {
        "adaptation": adaptive,
        "requests": k,
        "completed": len(done),
        "oom_failures": sum(1 for o in outcomes if not o.ok and o.oom),
        "other_failures": sum(1 for o in outcomes if not o.ok and not o.oom),
        "failure_details": sorted({f"{o.status}: {o.detail[:160]}" for o in outcomes if not o.ok}),
        "server_alive": alive,
        "peak_memory_bytes": peak,
        "peak_data_bytes": round(max(0, data_peak.peak - idle_data)) if alive else None,
        "planned_peak_bytes": round(planned.peak),
        "vmhwm_resets": sum(o.vmhwm_resets for o in outcomes),
        "cut_share_pct": round(100 * len(cuts) / len(done), 2) if done else None,
        "avg_cut_pct": round(100 * statistics.fmean(cuts), 2) if cuts else 0.0,
        "cos_batches": sorted(max(o.cos_batch_sizes) for o in done if o.cos_batch_sizes),
        "decisions": int(decisions),
        "decision_ms": round(1e3 * (after[0] - before[0]) / decisions, 4) if decisions else None,
        "wall_s": round(seconds, 2),
    }


def _start(testbed: Testbed, adaptive: bool, budget: int | None, weights: int) -> int:
    settings: dict[str, object] = {
        "adaptation": adaptive,
        "b_min": 25,
        "adaptation_window_s": 0.02,
        "max_concurrent_per_device": 8,
        "framework_reserve_bytes": 0,
        # The thesis' figure: the budget is the requests' own, the server's idle RSS aside.
        "count_process_memory": False,
    }
    if budget is not None:
        settings["cpu_memory_budget_bytes"] = budget + weights
    testbed.start_stack(settings=settings, env=_MALLOC_ENV)
    pid = testbed.stack.server_pid
    if pid is None:
        raise ScenarioError("the stack runs no HAPI server")
    return pid


def _share(nbytes: int | None, budget: int) -> float | None:
    return None if nbytes is None else round(100 * nbytes / budget, 1)


def _limited_server(
    testbed: Testbed,
    adaptive: bool,
    budget: int,
    weights: int,
    stored: StoredModel,
    data: DatasetReady,
    shard: str,
) -> tuple[int, _Requester, dict[str, Any]]:
    """A fresh server, warmed up and calibrated, then held to ``budget`` with RLIMIT_DATA."""
    pid = _start(testbed, adaptive, budget, weights)
    requester = _Requester(testbed, stored, data.container, shard)
    requester.fire(8, split_index=1)
    calibration = _calibrate(requester, testbed)
    limit = _status_field(pid, "VmData") + budget
    resource.prlimit(pid, resource.RLIMIT_DATA, (limit, limit))
    return pid, requester, calibration


def run_adaptation(testbed: Testbed, out_dir: str, quick: bool = True) -> int:
    """The ``adaptation`` scenario; writes ``adaptation.json``, ``adaptation.csv``, ``adaptation.png``."""
    counts = (1, 4, 6, 7, 8) if quick else (1, 2, 3, 4, 5, 6, 7, 8)
    weights = _weights_bytes(ARCH)
    pid = _start(testbed, False, None, weights)
    data, models = ensure_photos_and_models(
        testbed, SHARD // 10, f"bench-adapt-{SHARD}", SHARD, [ARCH]
    )
    stored = models[ARCH]
    shard = data.manifest.shards[0].name
    requester = _Requester(testbed, stored, data.container, shard)
    requester.fire(8, split_index=1)  # loads the weights and starts every worker thread
    _calibrate(requester, testbed)  # so that the server's probe measures no more from now on
    one = _measure_one(requester, pid)
    budget = int(HEADROOM * one)
    print(
        f"[adaptation] one request of {SHARD} images ({ARCH}, split {requester.request.split_index}) "
        f"peaks at {one / 2**20:.0f} MiB; budget {budget / 2**20:.0f} MiB",
        flush=True,
    )
    results = ResultSet.start(
        "adaptation",
        testbed=testbed.describe(),
        quick=quick,
        model=ARCH,
        split_index=requester.request.split_index,
        shard_images=SHARD,
        b_max=SHARD,
        b_min=25,
        one_request_peak_bytes=one,
        budget_bytes=budget,
        weights_bytes=weights,
        enforcement="RLIMIT_DATA of the HAPI server = idle data + budget; glibc with fixed mmap/trim "
        "thresholds (blocks over 128 KiB returned on free)",
        dataset={
            "container": data.container,
            "source": data.manifest.source,
            "stored_bytes_per_sample": data.manifest.mean_shard_bytes_per_sample,
        },
    )
    calibrations: dict[str, Any] = {}
    for adaptive in (True, False):
        pid, requester, calibration = _limited_server(
            testbed, adaptive, budget, weights, stored, data, shard
        )
        calibrations["on" if adaptive else "off"] = calibration
        print(
            f"[adaptation] BA {'on ' if adaptive else 'off'} calibration: {calibration}", flush=True
        )
        for k in counts:
            if not Path(f"/proc/{pid}").exists():  # an OOM took the whole server down
                pid, requester, _ = _limited_server(
                    testbed, adaptive, budget, weights, stored, data, shard
                )
            row = _point(requester, testbed, pid, k, adaptive)
            row.update(
                model=ARCH,
                dataset=data.container,
                dataset_source=data.manifest.source,
                stored_bytes_per_sample=round(data.manifest.mean_shard_bytes_per_sample, 1),
                rate_target_mbit=None,
                budget_bytes=budget,
                peak_share_pct=_share(row["peak_memory_bytes"], budget),
                data_share_pct=_share(row["peak_data_bytes"], budget),
                planned_share_pct=_share(row["planned_peak_bytes"], budget),
            )
            results.add(row)
            results.write(Path(out_dir))
            print(
                f"[adaptation] BA {'on ' if adaptive else 'off'} {k} requests: {row['completed']} completed, "
                f"{row['oom_failures']} OOM, peak {(row['peak_memory_bytes'] or 0) / 2**20:.0f} MiB "
                f"({row['peak_share_pct']}% of the budget; VmData {row['data_share_pct']}%; "
                f"planned {row['planned_share_pct']}%), "
                f"{row['cut_share_pct']}% cut by "
                f"{row['avg_cut_pct']}%, batches {row['cos_batches']}, probe readings {row['vmhwm_resets']}",
                flush=True,
            )
    results.meta["calibration"] = calibrations
    testbed.stop_stack()
    out = Path(out_dir)
    paths = results.write(out) + plot_adaptation(results, out)
    print("[adaptation] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0
