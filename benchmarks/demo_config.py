"""The demo's settings, read without torch: ``hapi demo --help`` shows their defaults."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NETWORK_BOUND_SHARE", "DemoConfig"]

#: The demo's default rate as a share of the crossover rate: deep enough in the network-bound
#: regime that the link, not the CPU, decides BASELINE's epoch (three times its compute), shallow
#: enough that BASELINE's epoch stays a few minutes on a 2-core machine.
NETWORK_BOUND_SHARE = 1 / 3


@dataclass(frozen=True)
class DemoConfig:
    """The demo's sizes: small enough for 2 cores, large enough for stable epoch times."""

    rate_mbit: float | None = None
    """None: a third of the measured crossover rate (``NETWORK_BOUND_SHARE``)."""
    model: str = "efficientnet_lite0"
    #: Fine-tune the last two MBConv stages and the head (``blocks.5.0`` on), a usual choice when
    #: the new images differ from ImageNet; the model's default (18) trains only the head.
    freeze_index: int = 13
    train_per_class: int = 30
    test_per_class: int = 10
    shard_size: int = 50
    batch_size: int = 50  # one shard per iteration: every iteration is a full batch
    #: Shards in flight (None: the client's default, two here). More do not help: the server does
    #: not run one client's requests in the order sent, so the one the client needs next can wait.
    prefetch: int | None = None
    epochs: int = 1
    lr: float = 0.01
