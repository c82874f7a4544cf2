"""Byzantine-robust gradient aggregation, attacks and LB-BSP batch balancing.

Pure library (torch only, no ``torch.distributed``), used by the client's multi-worker
fine-tuning and by the benchmarks::

    from hapi_client.robust import get_aggregator, get_attack, gather_replies

    rule = get_aggregator("bulyan", n=11, f=2)          # validated: Bulyan needs n >= 4f+3
    honest = [w.grad for w in workers]                  # 9 honest tensors of one shape
    replies = honest + get_attack("reverse", n_byzantine=2)(honest)
    update = rule(gather_replies(replies, q=11))        # same shape/device as the inputs

Modules: :mod:`.aggregators` (average, batch-weighted average, median, trimmed mean, Krum,
Multi-Krum, MDA, Bulyan), :mod:`.preaggregation` (NNM, bucketing, clipping, ``Chain``),
:mod:`.attacks`, :mod:`.replies` (fastest q of n), :mod:`.balancing` (LB-BSP),
:mod:`.registry` (by-name lookup), :mod:`.errors` (one exception tree).
"""

from typing import TYPE_CHECKING

from hapi_contract.lazy import attach

# Resolved on first use (PEP 562, see hapi_contract.lazy): importing the package loads no torch.
if TYPE_CHECKING:
    from ._tensors import Inputs
    from .aggregators import (
        MDA,
        Aggregator,
        Average,
        BatchWeightedAverage,
        Bulyan,
        Krum,
        Median,
        MultiKrum,
        NonFinitePolicy,
        TrimmedMean,
    )
    from .attacks import (
        ALittleIsEnough,
        Attack,
        DropAttack,
        FallOfEmpires,
        NonFiniteAttack,
        RandomAttack,
        ReverseAttack,
        alie_z_max,
    )
    from .balancing import (
        MEMORY_LIMIT_FRACTION,
        BatchBalancer,
        Phase,
        even_split,
        near_memory_limit,
    )
    from .errors import (
        BalancingError,
        ComplexityLimitError,
        InputMismatchError,
        InvalidParameterError,
        MissingRepliesError,
        NonFiniteInputError,
        RequirementError,
        RobustAggregationError,
        UnknownNameError,
    )
    from .preaggregation import Bucketing, Chain, Clipping, NearestNeighborMixing, PreAggregator
    from .registry import (
        AggregationRule,
        PreStep,
        aggregator_class,
        get_aggregator,
        get_attack,
        get_preaggregator,
        list_aggregators,
        list_attacks,
        list_preaggregators,
    )
    from .replies import gather_replies

__getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "MDA",
    "MEMORY_LIMIT_FRACTION",
    "ALittleIsEnough",
    "AggregationRule",
    "Aggregator",
    "Attack",
    "Average",
    "BalancingError",
    "BatchBalancer",
    "BatchWeightedAverage",
    "Bucketing",
    "Bulyan",
    "Chain",
    "Clipping",
    "ComplexityLimitError",
    "DropAttack",
    "FallOfEmpires",
    "Inputs",
    "InputMismatchError",
    "InvalidParameterError",
    "Krum",
    "Median",
    "MissingRepliesError",
    "MultiKrum",
    "NearestNeighborMixing",
    "NonFiniteAttack",
    "NonFiniteInputError",
    "NonFinitePolicy",
    "Phase",
    "PreAggregator",
    "PreStep",
    "RandomAttack",
    "RequirementError",
    "ReverseAttack",
    "RobustAggregationError",
    "TrimmedMean",
    "UnknownNameError",
    "aggregator_class",
    "alie_z_max",
    "even_split",
    "gather_replies",
    "get_aggregator",
    "get_attack",
    "get_preaggregator",
    "list_aggregators",
    "list_attacks",
    "list_preaggregators",
    "near_memory_limit",
]
