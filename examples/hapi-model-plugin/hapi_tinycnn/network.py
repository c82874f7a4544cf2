"""The network of the example plugin: four convolution blocks, a pooling and a classifier."""

from __future__ import annotations

import torch
from torch import nn


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class TinyCNN(nn.Module):
    """64x64x3 -> 4x4x128 through four blocks that halve the side; then pool and classify.

    The classifier is the last ``nn.Linear``: HAPI's default freeze index leaves it trainable
    and ``replace_classifier`` swaps it for a new number of classes.
    """

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _block(3, 16), _block(16, 32), _block(32, 64), _block(64, 128)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))
