"""What every fine-tuning epoch reports, whichever loop ran it.

:class:`EpochSummary` holds the fields that the single-process recipe
(:class:`~hapi_client.finetune.EpochMetrics`) and the multi-worker trainer
(:class:`~hapi_client.distributed.DistributedEpochMetrics`) both measure; each adds what only it
knows. Fields are keyword-only so that subclasses can add theirs in any order, and
``dataclasses.asdict`` gives the JSON both write (same keys as before the base existed).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EpochSummary"]


@dataclass(kw_only=True)
class EpochSummary:
    """One epoch of fine-tuning: quality, time and transfer."""

    #: 1-based epoch number.
    epoch: int
    #: Mean training loss over the epoch's samples.
    loss: float
    train_accuracy: float
    #: Accuracy on the held-out container after the epoch; None without one.
    eval_accuracy: float | None
    #: Wall-clock seconds of the epoch (evaluation excluded).
    seconds: float
    #: Training samples the epoch went through.
    samples: int
    #: Bytes received from HAPI or Swift during the epoch (all workers' together).
    bytes_received: int
    #: HTTP requests made for the epoch's data (all workers' together).
    requests: int
