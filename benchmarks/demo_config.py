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
    #: 1200 photos, 24 iterations: what no pipeline can hide (the server's first batch before
    #: the link has anything to carry, the client's last step after it is done: 2.5-3 s for HAPI)
    #: is a tenth of HAPI's epoch; at 6 iterations it was a fifth, and HAPI's speed-up at most
    #: 0.84 of its bytes ratio however fast its server.
    train_per_class: int = 120
    test_per_class: int = 10
    shard_size: int = 50
    batch_size: int = 50  # one shard per iteration: every iteration is a full batch
    #: Shards in flight (None: the client's default: three for HAPI, whose server sends one
    #: client's responses in the order asked, two for BASELINE's Swift reads, where a third in
    #: flight only shares the link with the two before it).
    prefetch: int | None = None
    epochs: int = 1
    lr: float = 0.01
