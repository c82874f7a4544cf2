"""The fastest memory layout per head: ``channels_last`` where it measured faster on the device.

EfficientNet-Lite0's head to split 9 ran 2.56x faster on a CPU in ``channels_last`` (issue 30)
while ResNet18's and ViT-B/16's did not change, so the choice is measured, not assumed: once
per (architecture, split, input shape, device), on the request's first batch, and kept in
memory. Only the input is converted: a convolution given a ``channels_last`` input runs and
answers in that layout, and the head's weights, shared by every request of the model, stay
untouched. The features are equal to float rounding, as any change of kernel gives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

import torch

__all__ = ["LayoutChooser", "to_layout"]

log = logging.getLogger(__name__)

# channels_last must win by this much: the two timings are one run each, on a shared host.
_MARGIN = 0.9


def to_layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    if channels_last and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


class LayoutChooser:
    """Measures and keeps, per key, whether a head runs faster on a ``channels_last`` input."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._choices: dict[Hashable, bool] = {}

    def known(self, key: Hashable) -> bool | None:
        with self._lock:
            return self._choices.get(key)

    def forward(
        self, key: Hashable, head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        """``head(x)`` in the layout chosen for ``key``; the first call for a key measures both."""
        if not self.enabled or x.dim() != 4:
            return head(x)
        choice = self.known(key)
        if choice is not None:
            return head(to_layout(x, choice))
        contiguous = _timed(head, x)
        last = _timed(head, to_layout(x, True))
        choice = last[0] < _MARGIN * contiguous[0]
        with self._lock:
            self._choices.setdefault(key, choice)
        log.info(
            "layout of %s: %s (contiguous %.1f ms, channels_last %.1f ms)",
            key,
            "channels_last" if choice else "contiguous",
            contiguous[0] * 1000,
            last[0] * 1000,
        )
        return last[1] if choice else contiguous[1]


def _timed(
    head: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> tuple[float, torch.Tensor]:
    """The second of two runs (the first pays one-off allocations and kernel choices)."""
    head(x)
    _sync(x)
    start = time.perf_counter()
    y = head(x)
    _sync(x)
    return time.perf_counter() - start, y


def _sync(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
