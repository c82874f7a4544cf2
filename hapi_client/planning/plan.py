"""Planning the split: measure the costs, find a bandwidth, decide, agree across ranks.

The one sequence that :class:`~hapi_client.FeatureDataset` (at construction and at each epoch
boundary) and the multi-worker trainer (:mod:`hapi_client.distributed.setup`) both run:
:func:`plan_split`. The two rules it applies live beside it (:mod:`.time_rule`, the default, and
:mod:`.thesis_rule`, thesis Algorithm 2); :func:`decide_split` picks the rule for a choice.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hapi_contract import (
    Compression,
    DatasetLayout,
    DatasetManifest,
    OutputDtype,
    ShardSource,
    wire_itemsize,
)

from ..errors import ConfigurationError
from .costs import PipelineCosts, measure_pipeline_costs
from .decision import SplitChoice, SplitDecision
from .thesis_rule import ProfileLike, choose_split_index
from .time_rule import JobShape, choose_split_by_time

if TYPE_CHECKING:
    from ..client import HapiClient
    from ..preparation import PreparedModel

__all__ = ["SplitPlan", "decide_split", "plan_split"]

log = logging.getLogger(__name__)

_MEASURED = ("auto", "thesis")


@dataclass(frozen=True)
class SplitPlan:
    """A :func:`plan_split` answer: the decision and the costs measured on the way."""

    decision: SplitDecision
    costs: PipelineCosts | None = None
    """``split="auto"``'s measured costs (None otherwise, and on ranks other than 0): give them
    back to the next :func:`plan_split` of the same run, which then measures nothing again."""


def decide_split(
    prof: ProfileLike,
    manifest: DatasetManifest,
    batch_size: int,
    bandwidth: float | None,
    freeze: int,
    output_dtype: OutputDtype,
    split: SplitChoice | str,
    costs: PipelineCosts | None = None,
    world_size: int = 1,
    *,
    epochs: int = 1,
    cached: bool = False,
    planning_s: float = 0.0,
    cached_split: int | None = None,
) -> SplitDecision:
    """The split for ``split`` = ``"auto"`` (the fastest epoch predicted from ``costs`` and
    ``bandwidth``, each of ``world_size`` ranks taking its share of the manifest's samples;
    Algorithm 2 when the server's costs are missing), ``"thesis"`` (Algorithm 2 on
    ``bandwidth``), ``"freeze"`` or an index in ``[0, freeze]``. Pure: measures nothing.

    ``"auto"`` ranks the whole job: ``epochs`` epochs, the later ones from the feature cache
    where ``cached`` (the caller keeps features and no random augmentation changes them), plus
    the ``planning_s`` already spent; ``cached_split``: the split whose features the cache
    already holds (an epoch boundary's), whose epochs left are all cached ones."""
    if split == "freeze":
        return SplitDecision(freeze, "forced to the freeze index", 0.0, 0.0, 0.0, (), "forced")
    if isinstance(split, int) and not isinstance(split, bool):
        if not 0 <= split <= freeze:
            raise ConfigurationError(f"split index {split} must be in [0, freeze index {freeze}]")
        return SplitDecision(split, "forced by the caller", 0.0, 0.0, 0.0, (), "forced")
    if split not in _MEASURED:
        raise ConfigurationError(
            f"split must be 'auto', 'thesis', 'freeze' or an index, got {split!r}"
        )
    if bandwidth is None:
        raise ConfigurationError(f"split={split!r} needs a bandwidth estimate (probe Swift first)")
    if split == "auto" and costs is not None and costs.server is not None:
        iterations = -(-manifest.num_samples // (batch_size * world_size))
        return choose_split_by_time(
            costs.server,
            costs.client,
            manifest.mean_shard_bytes_per_sample,
            batch_size,
            bandwidth,
            freeze,
            job=JobShape(iterations, epochs, cached, planning_s, cached_split),
            read_s_per_sample=1 / costs.objects_per_s if costs.objects_per_s else 0.0,
        )
    decision = choose_split_index(
        prof,
        manifest.mean_shard_bytes_per_sample,
        batch_size,
        bandwidth,
        freeze,
        wire_bytes_per_element=wire_itemsize(output_dtype),
    )
    if split == "auto":
        why = costs.server_missing if costs is not None else "no measured costs"
        decision = dataclasses.replace(decision, reason=f"{why}; Algorithm 2: {decision.reason}")
    return decision


def plan_split(
    client: HapiClient,
    prepared: PreparedModel,
    container: str,
    choice: SplitChoice | str,
    *,
    batch_size: int,
    output_dtype: OutputDtype,
    compression: Compression,
    b_max: int,
    device: torch.device | None = None,
    costs: PipelineCosts | None = None,
    current: SplitDecision | None = None,
    rank: int = 0,
    world_size: int = 1,
    collective: bool = False,
    epochs: int = 1,
    cached: bool = False,
) -> SplitPlan:
    """Plan the split of one run on ``container``: measure, find a bandwidth, decide, agree.

    1. **Costs** (``"auto"`` only): the client's and the server's cost of every split up to the
       freeze index, measured on ``device`` (where training runs; default CUDA when there is
       one), unless ``costs`` (an earlier plan's) are given.
    2. **Bandwidth** (``"auto"`` and ``"thesis"``): the client's moving estimate; where it has
       none yet, the rate of the ranged read that fetched the images for the costs (a read too
       short to move the moving estimate is still timed on its own); where there is none either
       (``"thesis"``, or a ``"freeze"`` index of 0), one explicit probe of the first shard, whose
       own rate counts when the estimate still has none. So a plan never fails for want of a
       bandwidth: it measures one. (The multi-worker trainer used to probe only for
       ``"thesis"`` and refused ``"auto"`` when the costs' read was too short to time; the
       dataset's fallback, kept here, never needs that refusal.)
    3. **Decision** (:func:`decide_split`), for an epoch of the manifest's samples over
       ``batch_size`` x ``world_size`` iterations (``world_size`` ranks each taking batches of
       ``batch_size``; 1 where ``batch_size`` is already a round's, as in the robust trainer). With ``current`` (an epoch boundary), the current
       decision stays unless the bandwidth estimate drifted more than 25 % from the one it was
       made on. ``"auto"`` ranks the whole job: ``epochs`` epochs, the later ones from the
       feature cache where ``cached``, plus the seconds this plan spent measuring; at an epoch
       boundary with ``cached``, the current split's epochs left all come from the cache (its
       features are there), so a drift moves the split only where re-extracting pays.
    4. **Agreement** with ``collective`` (``torch.distributed`` is initialised): rank 0 runs
       steps 1 to 3 alone and broadcasts its index (an int64 tensor: nothing is pickled); the
       other ranks measure nothing and get an ``"agreed"`` decision with that index. Every rank
       must call it. A forced choice (``"freeze"``, an index) is the same on every rank and is
       decided locally, with no collective.
    """
    prof, manifest, freeze = prepared.profile, prepared.manifest, prepared.freeze_index
    if choice not in _MEASURED:
        return SplitPlan(
            decide_split(prof, manifest, batch_size, None, freeze, output_dtype, choice), costs
        )

    def here() -> SplitPlan:
        began = time.perf_counter()
        bandwidth = client.bandwidth.bytes_per_s
        if current is not None and (
            bandwidth is None or not client.bandwidth.drifted(current.budget_bytes)
        ):
            return SplitPlan(current, costs)
        measured = costs
        if choice == "auto" and measured is None:
            measured = measure_pipeline_costs(
                client.swift,
                client.transport,
                prepared,
                container,
                output_dtype=output_dtype,
                compression=compression,
                device=device or _default_device(),
                b_max=b_max,
            )
        if bandwidth is None:
            bandwidth = client.bandwidth.bytes_per_s
        if bandwidth is None:
            if measured is not None and measured.probed_bytes_per_s is not None:
                bandwidth = measured.probed_bytes_per_s
            else:
                first = ShardSource.of(manifest, container, 0)
                # A folder part is a small list of names: reading it times the request, not
                # the link. The model's weights are a large object on the same link.
                target = (
                    (prepared.stored.container, prepared.stored.object)
                    if first.layout is DatasetLayout.FOLDER
                    else (first.container, first.shard)
                )
                probed = client.swift.probe(*target)
                bandwidth = client.bandwidth.bytes_per_s or probed
        decision = decide_split(
            prof,
            manifest,
            batch_size,
            bandwidth,
            freeze,
            output_dtype,
            choice,
            measured,
            world_size,
            epochs=epochs,
            cached=cached,
            planning_s=time.perf_counter() - began,
            # The epochs run so far filled the cache at the current split.
            cached_split=current.split_index if current is not None and cached else None,
        )
        if current is not None and decision.split_index != current.split_index:
            log.info(
                "bandwidth drifted to %.1f Mbit/s: split %d -> %d",
                bandwidth * 8e-6,
                current.split_index,
                decision.split_index,
            )
        return SplitPlan(decision, measured)

    if not collective:
        return here()
    plan = here() if rank == 0 else None
    index = broadcast_index(plan.decision.split_index if plan is not None else -1)
    if plan is not None:
        return plan
    return SplitPlan(SplitDecision(index, "rank 0's choice", 0.0, 0.0, 0.0, (), "agreed"))


def broadcast_index(index: int) -> int:
    """Rank 0's ``index`` on every rank (host memory, except on a pure NCCL group)."""
    dist = torch.distributed
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([index], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return int(t[0])


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
