"""The scenarios of ``hapi bench`` and how to run them.

Scenarios that need the stack run on one testbed (one namespace session, one stack start shared
where their settings allow); the others (``split``, ``gars``, ``startup``, ``backbones``) run
in this process.
"""

from __future__ import annotations

import importlib
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ScenarioError

if TYPE_CHECKING:
    from .testbed import Testbed

__all__ = ["ORDER", "SCENARIOS", "Scenario", "run_scenarios", "testbed_job"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scenario:
    name: str
    help: str
    entry: str
    """``module:function``: ``function(testbed, out_dir, quick)`` or ``function(out_dir, quick)``."""
    testbed: bool


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "split",
            "chosen split vs bandwidth and batch (Table 5.3, Fig 5.12); profile only",
            "hapi_bench.scenario_split:run_split",
            False,
        ),
        Scenario(
            "gars",
            "aggregation-rule timing (benchmarks/gars.py)",
            "hapi_bench.scenario_gars:run_gars",
            False,
        ),
        Scenario(
            "startup",
            "wall time and peak RSS of `hapi --help`, `import hapi_client`, `import torch`",
            "hapi_bench.startup:run_startup",
            False,
        ),
        Scenario(
            "backbones",
            "modern backbones (ViT, Swin, ConvNeXt, ...): bytes per split, each rule's split at "
            "5/50/1000 Mbit/s, modelled oracle; costs measured on this CPU",
            "hapi_bench.scenario_backbones:run_backbones",
            False,
        ),
        Scenario(
            "e2e",
            "epoch time and bytes/iteration of BASELINE, HAPI, ALL_IN_COS over shaped links "
            "(Fig 5.9, 5.10)",
            "hapi_bench.scenario_e2e:run_e2e",
            True,
        ),
        Scenario(
            "oracle",
            "each split rule's epoch time over the best split's, per model and rate (measured)",
            "hapi_bench.scenario_oracle:run_oracle",
            True,
        ),
        Scenario(
            "jobsplit",
            "the split rule on folder datasets indexed in place (12 KB and 110 KB JPEGs) and on "
            "shards, a 3-epoch cached job: auto, freeze, BASELINE and nearby splits' job time "
            "over the best measured (issue 31)",
            "hapi_bench.scenario_job_split:run_job_split",
            True,
        ),
        Scenario(
            "tenants",
            "1..10 simultaneous jobs, HAPI vs ALL_IN_COS (Fig 5.11)",
            "hapi_bench.scenario_tenants:run_tenants",
            True,
        ),
        Scenario(
            "adaptation",
            "batch adaptation on/off under a memory budget (Fig 5.13, Table 5.4)",
            "hapi_bench.scenario_adaptation:run_adaptation",
            True,
        ),
        Scenario(
            "proxy",
            "decoupled HAPI server vs in-proxy execution (Table 5.1)",
            "hapi_bench.scenario_proxy:run_proxy",
            True,
        ),
        Scenario(
            "inplace",
            "one request over an uploaded shard vs the same images as single objects indexed "
            "in place (issue 23): images/s on the server, read and compute time",
            "hapi_bench.scenario_in_place:run_in_place",
            True,
        ),
        Scenario(
            "roofline",
            "the server's images/s against its ceilings (decode per core x cores, the head at "
            "the COS batch, the Swift read) and the new decode/layout path against the old one "
            "(issue 30)",
            "hapi_bench.scenario_roofline:run_roofline",
            True,
        ),
        Scenario(
            "sweep",
            "1, 2, 4 concurrent fine-tunes of one model on one dataset and split, feature store "
            "off and on (issue 32): wall time, server compute seconds, Swift bytes read",
            "hapi_bench.scenario_sweep:run_sweep",
            True,
        ),
    )
}
#: The order of ``all``: the fast, stack-free ones first.
ORDER = (
    "split",
    "gars",
    "startup",
    "backbones",
    "e2e",
    "oracle",
    "jobsplit",
    "tenants",
    "adaptation",
    "proxy",
    "inplace",
    "sweep",
    "roofline",
)


def _function(entry: str) -> Callable[..., int]:
    module, _, name = entry.partition(":")
    fn: Callable[..., int] = getattr(importlib.import_module(module), name)
    return fn


def _run_each(names: list[str], call: Callable[[Scenario], int]) -> int:
    failed = []
    for name in names:
        started = time.perf_counter()
        print(f"== {name}: {SCENARIOS[name].help}", flush=True)
        try:
            code = call(SCENARIOS[name])
        except Exception:  # noqa: BLE001 - one scenario's failure must not lose the others
            traceback.print_exc()
            code = 1
        print(
            f"== {name}: {'done' if code == 0 else 'FAILED'} in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        if code != 0:
            failed.append(name)
    if failed:
        print(f"== failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


def testbed_job(testbed: Testbed, names: list[str], out_dir: str, quick: bool) -> int:
    """Run the testbed scenarios ``names`` one after the other on ``testbed``."""
    print(
        f"== testbed: {testbed.kind} link ({testbed.link.method}); {testbed.cores.describe()}",
        flush=True,
    )
    try:
        return _run_each(names, lambda s: _function(s.entry)(testbed, out_dir=out_dir, quick=quick))
    finally:
        testbed.stop_stack()


def run_scenarios(
    names: list[str],
    out_dir: Path,
    *,
    quick: bool,
    state_dir: Path,
    shaping: bool | None = None,
    nice: int = 0,
) -> int:
    """Run ``names`` (``all`` for every scenario) and return an exit code (1 if any failed).

    ``nice`` applies to the testbed scenarios (see :func:`hapi_bench.run_job`).
    """
    if names == ["all"]:
        names = list(ORDER)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ScenarioError(
            f"unknown scenario {', '.join(unknown)}; choose from {', '.join(ORDER)} or all"
        )
    local = [n for n in names if not SCENARIOS[n].testbed]
    remote = [n for n in names if SCENARIOS[n].testbed]
    out = str(out_dir.resolve())
    code = _run_each(local, lambda s: _function(s.entry)(out_dir=out, quick=quick)) if local else 0
    if remote:
        # Imported here: the testbed needs torch, and `hapi bench --help` reads this module.
        from .testbed import run_job

        kwargs = {"names": remote, "out_dir": out, "quick": quick}
        code |= run_job(
            "hapi_bench.scenarios:testbed_job", kwargs, state_dir, shaping=shaping, nice=nice
        )
    return code
