"""Multi-worker, Byzantine-robust fine-tuning on torch.distributed (torchrun; gloo, NCCL on GPU).

Each worker streams its own shards through HAPI (or the raw baseline) and computes gradients of
the trainable tail; the trusted aggregator (rank 0, also worker 0) takes the fastest q of n
gradients within a deadline, combines them with a :mod:`hapi_client.robust` rule and sends the
result back; every worker applies it with the same optimizer, so the replicas stay identical.
LB-BSP can move samples from slow to fast workers between rounds::

    from hapi_client import TrainOptions
    from hapi_client.distributed import DistributedConfig, launch

    config = DistributedConfig(model="models/efficientnet_lite0", container="fmnist-train",
                               eval_container="fmnist-test", aggregator="bulyan", f=1,
                               attack="reverse", attackers=(6,),
                               train=TrainOptions(batch_size=70, epochs=5))
    result = launch(7, config)                     # runs torchrun, returns rank 0's result
    print(result.history[-1].eval_accuracy)

Inside your own torchrun script, call :func:`distributed_finetune` on every rank instead.
Modules: :mod:`.config`, :mod:`.schedule` (who trains on which samples), :mod:`.channel` and
:mod:`.messages` (the gradient side channel), :mod:`.replica` (flat gradients, checksums),
:mod:`.data` (per-worker shard store), :mod:`.trainer` (the entry points and one rank's run),
which uses :mod:`.setup` (device, backend, the model replica), :mod:`.rendezvous` (opening the
side channel), :mod:`.rounds` (one round on the aggregator and on a worker), :mod:`.attacker`
(forged replies), :mod:`.epoch_end` (replica check, totals, evaluation) and :mod:`.results`;
:mod:`.checkpoint` (resume after a restart, in the same or another world), :mod:`.sample_log`
(which samples each rank was dealt, for audits); :mod:`.launcher` (torchrun), :mod:`.errors`.
"""

from .channel import AggregatorChannel, GatherResult, Keepalive, WorkerChannel
from .checkpoint import Checkpoint, load_checkpoint, round_seed, save_checkpoint
from .config import DistributedConfig
from .errors import (
    ChannelError,
    DistributedConfigError,
    DistributedError,
    GatherTimeoutError,
    LaunchError,
    ReplicaDivergenceError,
    ScheduleError,
    TrainingCheckpointError,
)
from .launcher import launch, launch_many, torchrun_command
from .messages import GradientMessage, UpdateMessage
from .replica import flat_gradient, set_flat_gradient, state_checksum, trainable_parameters
from .sample_log import SampleLog, delivered, read_sample_log
from .schedule import (
    EpochSchedule,
    Segment,
    assign_shards,
    remaining_sizes,
    resumed_totals,
    round_totals,
    scale_sizes,
)
from .setup import PreparedModels
from .trainer import DistributedEpochMetrics, DistributedResult, distributed_finetune, run_sequence

__all__ = [
    "AggregatorChannel",
    "ChannelError",
    "Checkpoint",
    "TrainingCheckpointError",
    "DistributedConfig",
    "DistributedConfigError",
    "DistributedEpochMetrics",
    "DistributedError",
    "DistributedResult",
    "EpochSchedule",
    "GatherResult",
    "GatherTimeoutError",
    "GradientMessage",
    "Keepalive",
    "LaunchError",
    "ReplicaDivergenceError",
    "ScheduleError",
    "Segment",
    "SampleLog",
    "UpdateMessage",
    "WorkerChannel",
    "assign_shards",
    "delivered",
    "distributed_finetune",
    "flat_gradient",
    "launch",
    "launch_many",
    "load_checkpoint",
    "read_sample_log",
    "remaining_sizes",
    "resumed_totals",
    "round_seed",
    "round_totals",
    "PreparedModels",
    "run_sequence",
    "save_checkpoint",
    "scale_sizes",
    "set_flat_gradient",
    "state_checksum",
    "torchrun_command",
    "trainable_parameters",
]
