"""``proxy``: the decoupled HAPI server vs extraction inside the Swift proxy (Table 5.1).

The client talks to Swift's HAPI filter (``via="swift"``) in both cases; the filter either
forwards to the HAPI server (``execution = decoupled``, the default) or runs the model in the
proxy's own thread pool (``execution = in_proxy``, the thesis' first prototype). Per model: one
HAPI fine-tuning epoch split at the freeze index, over a 1 Gbit/s link, a few requests in flight
as the client prefetches. The in-proxy mode exists only when ``swift_middleware`` offers it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hapi_client.options import ExtractOptions, TrainOptions

from .data import ensure_photos_and_models
from .plots import plot_proxy
from .results import ResultSet
from .runs import RunSpec, measured_finetune, warm_server
from .testbed import Testbed
from .thesis import TABLE_5_1

__all__ = ["in_proxy_available", "run_proxy"]

RATE_MBIT = 1000.0


def in_proxy_available() -> str | None:
    """None when ``swift_middleware`` supports ``execution = in_proxy``, else why not."""
    if importlib.util.find_spec("swift_middleware.in_proxy") is None:
        return "swift_middleware has no in_proxy module"
    from swift_middleware import config

    if "IN_PROXY" not in getattr(config.Execution, "__members__", {}):
        return "swift_middleware's Execution has no in_proxy value"
    return None


def run_proxy(testbed: Testbed, out_dir: str, quick: bool = True) -> int:
    """The ``proxy`` scenario; writes ``proxy.json`` and ``proxy.csv`` (or says it is unavailable)."""
    archs = ["alexnet", "resnet18"] if quick else ["alexnet", "resnet18", "resnet50", "densenet121"]
    results = ResultSet.start(
        "proxy", testbed=testbed.describe(), quick=quick, thesis_table_5_1=TABLE_5_1
    )
    missing = in_proxy_available()
    out = Path(out_dir)
    if missing is not None:
        results.meta["unavailable"] = missing
        results.write(out)
        print(f"[proxy] not available: {missing}", flush=True)
        return 0
    cores = str(len(testbed.cores.server))
    # The same threads and concurrency as the testbed's HAPI server: one request per server core.
    in_proxy = {"hapi": {"execution": "in_proxy", "torch_threads": cores, "max_concurrent": cores}}
    for execution, filters in (("decoupled", {}), ("in_proxy", in_proxy)):
        testbed.start_stack(proxy_extra_filters=filters)
        data, stored = ensure_photos_and_models(testbed, 10, "bench-proxy-50", 50, archs)
        warm_server(testbed, list(stored.values()), data.container, data.manifest, via="swift")
        testbed.set_rate(RATE_MBIT)
        check = testbed.measure_link()
        for arch in archs:
            spec = RunSpec(
                stored[arch],
                "hapi",
                data.container,
                data.manifest,
                RATE_MBIT,
                train=TrainOptions(batch_size=50),
                extract=ExtractOptions(split="freeze", cache_features=False),
                progress=False,
                via="swift",
            )
            _, row = measured_finetune(testbed, spec, check)
            row["execution"] = execution
            row["thesis_seconds"] = TABLE_5_1.get(arch, {}).get(execution)
            results.add(row)
            print(
                f"[proxy] {arch:12s} {execution:9s}: epoch {row['epoch_s']:6.2f} s "
                f"(storage CPU {row['storage_cpu_s']:.2f} s)",
                flush=True,
            )
        results.meta.setdefault("link_checks", []).append(check.as_dict())
    testbed.stop_stack()
    paths = results.write(out) + plot_proxy(results, out)
    print("[proxy] wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0
