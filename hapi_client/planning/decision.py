"""What a split plan decides: :class:`SplitDecision`, and the choices a caller may ask for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .time_rule import JobShape, StageTimes

__all__ = ["SPLIT_RULES", "SplitChoice", "SplitDecision"]

#: ``"auto"`` (predicted time per iteration, :mod:`hapi_client.planning.time_rule`), ``"thesis"``
#: (thesis Algorithm 2 on the measured bandwidth), ``"freeze"`` (the freeze index) or an index.
SplitChoice = int | Literal["auto", "thesis", "freeze"]
SPLIT_RULES = ("auto", "thesis", "freeze")


@dataclass(frozen=True)
class SplitDecision:
    split_index: int
    reason: str
    input_bytes_per_batch: float
    output_bytes_per_batch: float
    """Bytes per iteration the chosen split ships (the input's when split is 0)."""
    budget_bytes: float
    """Bytes one second of the measured bandwidth carries (0 when the split was forced)."""
    candidates: tuple[int, ...]
    rule: str = "thesis"
    """Which rule decided: ``"time"`` (predicted time, the default), ``"thesis"`` (Algorithm 2),
    ``"forced"`` (the caller's index, the freeze index, or a resumed epoch's saved index) or
    ``"agreed"`` (a rank other than 0: rank 0's index, broadcast)."""
    predictions: tuple[StageTimes, ...] = field(default=(), repr=False)
    """The rule ``"time"``'s predicted stages of every split it considered."""
    iterations: int | None = None
    """The epoch's iterations the rule ``"time"`` ranked them over (``StageTimes.predicted_s``);
    ``None``: over one steady-state iteration."""
    job: JobShape | None = field(default=None, repr=False)
    """The whole job the rule ``"time"`` ranked over (epochs, feature cache), where known."""
