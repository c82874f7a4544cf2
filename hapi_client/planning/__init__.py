"""Choosing the split: the costs, the two rules and the one planning sequence.

* :func:`plan_split`: measure the costs, find a bandwidth, decide, agree across ranks (what
  :class:`~hapi_client.FeatureDataset` and the multi-worker trainer both call);
* :func:`decide_split`: the decision alone, from given costs and bandwidth;
* the rules: :func:`choose_split_by_time` (``split="auto"``, the default) and
  :func:`choose_split_index` (``split="thesis"``, thesis Algorithm 2);
* the costs: :func:`measure_pipeline_costs`, :func:`measure_client_costs`.
"""

from .costs import PipelineCosts, measure_client_costs, measure_pipeline_costs
from .decision import SPLIT_RULES, SplitChoice, SplitDecision
from .plan import SplitPlan, broadcast_index, decide_split, plan_split
from .thesis_rule import choose_split_index
from .time_rule import (
    ClientCosts,
    JobShape,
    ServerCosts,
    StageTimes,
    choose_split_by_time,
    predict_stage_times,
)

__all__ = [
    "SPLIT_RULES",
    "ClientCosts",
    "JobShape",
    "PipelineCosts",
    "ServerCosts",
    "SplitChoice",
    "SplitDecision",
    "SplitPlan",
    "StageTimes",
    "broadcast_index",
    "choose_split_by_time",
    "choose_split_index",
    "decide_split",
    "measure_client_costs",
    "measure_pipeline_costs",
    "plan_split",
    "predict_stage_times",
]
