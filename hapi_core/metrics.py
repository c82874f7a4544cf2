"""Prometheus metrics of one server instance (its own registry, so tests can build many apps)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BATCH_BUCKETS = (1, 5, 10, 25, 50, 100, 200, 400, 800, 1000, 2000, 5000, 10000)
_FAST_BUCKETS = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge(
            "hapi_queue_depth", "requests waiting for a COS batch size", ["device"], registry=r
        )
        self.planned_bytes = Gauge(
            "hapi_planned_memory_bytes",
            "memory planned for running requests",
            ["device"],
            registry=r,
        )
        self.planned_peak_bytes = Gauge(
            "hapi_planned_memory_peak_bytes",
            "highest planned memory of running requests plus resident weights since start; "
            "batch adaptation keeps it within the device total minus the framework reserve",
            ["device"],
            registry=r,
        )
        self.measured_peak_bytes = Gauge(
            "hapi_measured_peak_memory_bytes",
            "peak memory measured in the last request",
            ["device"],
            registry=r,
        )
        self.resident_weights_bytes = Gauge(
            "hapi_resident_weights_bytes", "weights loaded on the device", ["device"], registry=r
        )
        self.cos_batch_size = Histogram(
            "hapi_cos_batch_size",
            "COS batch sizes chosen by batch adaptation",
            ["device"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.adaptation_seconds = Histogram(
            "hapi_adaptation_decision_seconds",
            "time to solve one batch-adaptation round",
            ["device"],
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.bytes_streamed = Counter(
            "hapi_bytes_streamed", "feature bytes streamed to clients", ["endpoint"], registry=r
        )
        self.samples = Counter("hapi_samples", "samples processed", ["endpoint"], registry=r)
        self.send_order_wait_seconds = Histogram(
            "hapi_send_order_wait_seconds",
            "what an extraction's frames waited, in all, while an older response of the same "
            "client pipeline was sending (responses of a pipeline only)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.request_seconds = Histogram(
            "hapi_request_duration_seconds",
            "request duration, queueing included",
            ["endpoint", "status"],
            registry=r,
        )
        self.requests = Counter(
            "hapi_requests", "requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.process_resident_bytes = Gauge(
            "hapi_process_resident_bytes",
            "resident memory of this process now (/proc/self/statm)",
            registry=r,
        )
        self.process_resident_peak_bytes = Gauge(
            "hapi_process_resident_peak_bytes",
            "highest resident memory of this process, sampled (VmHWM is never reset)",
            registry=r,
        )

        # The shared feature store (hapi_core.shared_features) and what it saves.
        self.feature_store_hits = Counter(
            "hapi_feature_store_hits", "extractions answered from the feature store", registry=r
        )
        self.feature_store_misses = Counter(
            "hapi_feature_store_misses",
            "extractions the feature store did not hold and no request was computing",
            registry=r,
        )
        self.feature_store_coalesced = Counter(
            "hapi_feature_store_coalesced",
            "extractions that joined another request's computation of the same features",
            registry=r,
        )
        self.feature_store_evictions = Counter(
            "hapi_feature_store_evictions", "entries evicted (least recently used)", registry=r
        )
        self.feature_store_stored_bytes = Counter(
            "hapi_feature_store_stored_bytes", "feature bytes written to the store", registry=r
        )
        self.feature_store_bytes = Gauge(
            "hapi_feature_store_bytes", "feature bytes the store holds now", registry=r
        )
        self.extract_computations = Counter(
            "hapi_extract_computations",
            "extractions whose head ran (decode and forward), shared or not",
            registry=r,
        )
        self.extract_compute_seconds = Counter(
            "hapi_extract_compute_seconds",
            "seconds of decode, head forward and encode of the extractions that ran",
            registry=r,
        )
        # hapi_core.roofline defines the ceiling, for the benchmark and for these alike.
        self.roofline_ratio = Gauge(
            "hapi_roofline_ratio",
            "per running extraction: images/s achieved since its first decode over its "
            "roofline, the images/s the host's cores could reach with the request's own "
            "stage times (cores / (decode thread CPU s + head CPU s per image), the head's CPU "
            "s being its wall s times torch's threads; on a GPU the slower of cores / decode "
            "and the head); near 1: decode and head overlap fully on the cores",
            ["device", "request"],
            registry=r,
        )
        self.roofline_ratio_last = Gauge(
            "hapi_roofline_ratio_last",
            "hapi_roofline_ratio of the last extraction that ran on the device, at its end",
            ["device"],
            registry=r,
        )
        self.swift_read_bytes = Counter(
            "hapi_swift_read_bytes", "object bytes read from Swift as callers", registry=r
        )

    def watch_process(self, now: Callable[[], int], peak: Callable[[], int]) -> None:
        """Report the process's resident memory ``now`` and its sampled ``peak`` at every
        scrape."""
        self.process_resident_bytes.set_function(lambda: float(now()))
        self.process_resident_peak_bytes.set_function(lambda: float(max(peak(), now())))
