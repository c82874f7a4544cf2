"""``hapi_bench``: bandwidth-limited benchmarks that reproduce the thesis' evaluation, and the demo.

::

    from hapi_bench import run_scenarios, write_report
    run_scenarios(["e2e"], Path("bench-results"), quick=True, state_dir=Path(".hapi/bench"))
    write_report(Path("bench-results"), Path("docs/results.md"))

Every scenario runs on a :class:`Testbed`: Swift + the HAPI server on the server cores, the client
on the others, the client's link shaped with tc between two private network namespaces when
possible (else a client-side token bucket). The scenario modules (``scenario_e2e``,
``scenario_split``, ``scenario_tenants``, ``scenario_adaptation``, ``scenario_proxy``,
``scenario_gars``) are loaded when run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import AgentProcess, StackInfo, StorageControl, StorageSide
    from .data import (
        MODELS_CONTAINER,
        DatasetReady,
        ensure_dataset,
        ensure_models,
        ensure_photos_and_models,
        photos_spec,
    )
    from .demo import demo_job, format_demo_table
    from .demo_config import DemoConfig
    from .errors import AgentError, BenchError, ScenarioError, ShapingError
    from .instrument import ClientProbe, ExtractRecord, LowerBound, Sample, Sampler, lower_bound
    from .machine import CoreSplit, machine_info, pin_process, split_cores
    from .netns import (
        NETNS_ETC,
        NetnsRef,
        VethEnd,
        add_named_netns,
        add_veth_pair,
        delete_named_netns,
        netns_path,
        netns_support,
        run_in,
    )
    from .report import write_report
    from .results import DEFAULT_OUT, ResultSet, load_results
    from .runs import RunSpec, measured_finetune, warm_server
    from .scenarios import ORDER, SCENARIOS, Scenario, run_scenarios, testbed_job
    from .shaping import (
        CLIENT_ADDR,
        STORAGE_ADDR,
        TOLERANCE,
        ByteSource,
        Link,
        LinkCheck,
        NetnsLink,
        ThrottleLink,
        mbit_to_bytes,
        measure_rate,
        shaping_support,
    )
    from .testbed import Testbed, host_testbed, link_check_job, netns_testbed, run_job

# Loaded on first use: the storage agent imports this package and must not pay for torch.
_LAZY: dict[str, str] = {
    "AgentError": "errors",
    "AgentProcess": "agent",
    "BenchError": "errors",
    "ByteSource": "shaping",
    "CLIENT_ADDR": "shaping",
    "ClientProbe": "instrument",
    "CoreSplit": "machine",
    "DEFAULT_OUT": "results",
    "DatasetReady": "data",
    "DemoConfig": "demo_config",
    "ExtractRecord": "instrument",
    "Link": "shaping",
    "LinkCheck": "shaping",
    "LowerBound": "instrument",
    "MODELS_CONTAINER": "data",
    "NETNS_ETC": "netns",
    "NetnsLink": "shaping",
    "NetnsRef": "netns",
    "ORDER": "scenarios",
    "ResultSet": "results",
    "RunSpec": "runs",
    "SCENARIOS": "scenarios",
    "STORAGE_ADDR": "shaping",
    "Sample": "instrument",
    "Sampler": "instrument",
    "Scenario": "scenarios",
    "ScenarioError": "errors",
    "ShapingError": "errors",
    "StackInfo": "agent",
    "StorageControl": "agent",
    "StorageSide": "agent",
    "TOLERANCE": "shaping",
    "Testbed": "testbed",
    "ThrottleLink": "shaping",
    "VethEnd": "netns",
    "add_named_netns": "netns",
    "add_veth_pair": "netns",
    "delete_named_netns": "netns",
    "demo_job": "demo",
    "ensure_dataset": "data",
    "ensure_photos_and_models": "data",
    "ensure_models": "data",
    "format_demo_table": "demo",
    "host_testbed": "testbed",
    "link_check_job": "testbed",
    "load_results": "results",
    "lower_bound": "instrument",
    "machine_info": "machine",
    "mbit_to_bytes": "shaping",
    "measure_rate": "shaping",
    "measured_finetune": "runs",
    "netns_path": "netns",
    "netns_support": "netns",
    "netns_testbed": "testbed",
    "photos_spec": "data",
    "pin_process": "machine",
    "run_in": "netns",
    "run_job": "testbed",
    "run_scenarios": "scenarios",
    "shaping_support": "shaping",
    "split_cores": "machine",
    "testbed_job": "scenarios",
    "warm_server": "runs",
    "write_report": "report",
}

__all__ = [
    "CLIENT_ADDR",
    "DEFAULT_OUT",
    "MODELS_CONTAINER",
    "NETNS_ETC",
    "ORDER",
    "SCENARIOS",
    "STORAGE_ADDR",
    "TOLERANCE",
    "AgentError",
    "AgentProcess",
    "BenchError",
    "ByteSource",
    "ClientProbe",
    "CoreSplit",
    "DatasetReady",
    "DemoConfig",
    "ExtractRecord",
    "Link",
    "LinkCheck",
    "LowerBound",
    "NetnsLink",
    "NetnsRef",
    "ResultSet",
    "RunSpec",
    "Sample",
    "Sampler",
    "Scenario",
    "ScenarioError",
    "ShapingError",
    "StackInfo",
    "StorageControl",
    "StorageSide",
    "Testbed",
    "ThrottleLink",
    "VethEnd",
    "add_named_netns",
    "add_veth_pair",
    "delete_named_netns",
    "demo_job",
    "ensure_dataset",
    "ensure_photos_and_models",
    "ensure_models",
    "format_demo_table",
    "host_testbed",
    "link_check_job",
    "load_results",
    "lower_bound",
    "machine_info",
    "mbit_to_bytes",
    "measure_rate",
    "measured_finetune",
    "netns_path",
    "netns_support",
    "netns_testbed",
    "photos_spec",
    "pin_process",
    "run_in",
    "run_job",
    "run_scenarios",
    "shaping_support",
    "split_cores",
    "testbed_job",
    "warm_server",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hapi_bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hapi_bench.{module}"), name)
    globals()[name] = value
    return value
