"""The fine-tuning step shared by every mode (HAPI client, BASELINE client, ALL_IN_COS server).

One implementation, so that the three modes compute the same thing: layers ``[0, freeze)`` are
frozen and kept in eval mode (their batch-norm statistics stay those of the pretrained
network), layers ``[freeze, n)`` train. A mode that receives split-layer features runs
``model.tail(split)``; it still sees the frozen layers ``[split, freeze)`` in eval mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .splittable import SplittableModel

OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(
                f"unknown optimizer {self.name!r}; choose one of {', '.join(OPTIMIZERS)}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")

    def build(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        params = [p for p in params if p.requires_grad]
        if self.name == "sgd":
            return torch.optim.SGD(
                params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
            )
        if self.name == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)


def prepare_for_finetuning(model: SplittableModel, freeze_index: int) -> None:
    """Freeze layers ``[0, freeze_index)`` and set train/eval mode per layer."""
    model.freeze(freeze_index)
    set_modes(model, freeze_index)


def set_modes(model: SplittableModel, freeze_index: int, training: bool = True) -> None:
    model.train(False)
    if training:
        for layer in model.layers[freeze_index:]:
            layer.train(True)


@dataclass
class EpochStats:
    loss: float
    accuracy: float
    samples: int


def train_step(
    module: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    device: torch.device | str = "cpu",
    loss_fn: nn.Module | None = None,
) -> tuple[float, int]:
    """One batch: cross-entropy, backward, step; returns (loss x samples, correct predictions).

    :func:`train_batches` is this in a loop; a caller that must stop and resume mid-epoch (the
    client's checkpointed recipe) runs it batch by batch and keeps the sums itself.
    """
    inputs = inputs.to(device, dtype=torch.float32)
    labels = labels.to(device)
    optimizer.zero_grad(set_to_none=True)
    logits = module(inputs)
    loss = (loss_fn or nn.CrossEntropyLoss())(logits, labels)
    loss.backward()
    optimizer.step()
    return float(loss.detach()) * len(labels), int((logits.detach().argmax(1) == labels).sum())


def train_batches(
    module: nn.Module,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    device: torch.device | str = "cpu",
) -> EpochStats:
    """One pass over ``(inputs, labels)`` batches: cross-entropy, backward, step."""
    loss_fn = nn.CrossEntropyLoss()
    total_loss = 0.0
    correct = 0
    seen = 0
    for inputs, labels in batches:
        loss_sum, right = train_step(module, inputs, labels, optimizer, device, loss_fn)
        total_loss += loss_sum
        correct += right
        seen += len(labels)
    if seen == 0:
        return EpochStats(float("nan"), float("nan"), 0)
    return EpochStats(total_loss / seen, correct / seen, seen)


@torch.inference_mode()
def evaluate(
    module: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device | str = "cpu",
) -> float:
    """Top-1 accuracy of ``module`` (put in eval mode by the caller) over the batches."""
    correct = 0
    seen = 0
    for inputs, labels in batches:
        logits = module(inputs.to(device, dtype=torch.float32))
        correct += int((logits.argmax(1).cpu() == labels).sum())
        seen += len(labels)
    return correct / seen if seen else float("nan")
