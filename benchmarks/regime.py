"""Where the network becomes the bottleneck on the machine at hand.

BASELINE downloads every stored image and does all the work on the client: decoding, every
layer before the freeze index, and training the rest. Its epoch is bound by the slower of its
link (stored bytes per image over the rate) and its compute (seconds per image on the client).
The two are equal at the **crossover rate**; below it the network is the bottleneck, which is
the regime HAPI is for (it ships less than the stored image and moves compute next to the
storage). Above it both modes are bound by compute, and what HAPI can gain is what the server's
share of the work takes off the client.

The client's compute is measured, not assumed: :func:`hapi_client.planning.measure_client_costs`
on the client's own cores, over the dataset's own first images.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from hapi_client import StoredModel
from hapi_client.model_store import download_model
from hapi_client.planning import measure_client_costs
from hapi_contract import DatasetManifest, images_in_prefix

from .testbed import Testbed

__all__ = ["Regime", "measure_regime"]


@dataclass(frozen=True)
class Regime:
    """BASELINE's measured cost per image on the client and the rate where link equals compute."""

    model: str
    freeze_index: int
    batch_size: int
    stored_bytes_per_sample: float
    decode_s: float
    layers_s: float
    train_s: float
    """Training the tail per image, the optimizer step spread over the batch."""

    @property
    def compute_s(self) -> float:
        return self.decode_s + self.layers_s + self.train_s

    @property
    def crossover_mbit(self) -> float:
        return self.stored_bytes_per_sample * 8e-6 / self.compute_s

    def describe(self) -> str:
        return (
            f"BASELINE computes {1 / self.compute_s:.1f} images/s on the client "
            f"({self.compute_s * 1e3:.1f} ms each: decode {self.decode_s * 1e3:.1f}, layers "
            f"0-{self.freeze_index - 1} {self.layers_s * 1e3:.1f}, training "
            f"{self.train_s * 1e3:.1f}); at {self.stored_bytes_per_sample / 1e3:.0f} KB per "
            f"stored image its link keeps up with that at {self.crossover_mbit:.1f} Mbit/s: below "
            "that rate the network is the bottleneck, above it both modes are bound by compute"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "compute_s": self.compute_s, "crossover_mbit": self.crossover_mbit}


def measure_regime(
    testbed: Testbed,
    stored: StoredModel,
    container: str,
    manifest: DatasetManifest,
    freeze_index: int,
    batch_size: int,
) -> Regime:
    """Measure BASELINE's per-image compute on this process's (the client's) cores."""
    with testbed.client() as client:
        net = download_model(client.swift, stored)
        data, _ = client.swift.get(container, manifest.shards[0].name, observe=False)
    if len(manifest.classes) != net.num_classes:
        net.replace_classifier(len(manifest.classes))
    images = images_in_prefix(data, 8)
    costs = measure_client_costs(
        net, net.transform, freeze_index, images, torch.device("cpu"), batch=min(batch_size, 16)
    )
    return Regime(
        stored.arch,
        freeze_index,
        batch_size,
        manifest.mean_shard_bytes_per_sample,
        costs.decode_s,
        sum(costs.layer_s[:freeze_index]),
        costs.train_s + costs.step_s / batch_size,
    )
