"""The thesis' split rule: Algorithm 2, made precise (``split="thesis"``).

HAPI's default rule predicts time instead (:mod:`hapi_client.planning.time_rule`); this one
stays, under its own name, as the thesis states it, with one fix to its fallback (below).

Read as R1 and R2 of ``docs/references.md`` (thesis §5.4.4, Algorithm 2):

* sizes are per **training batch** at the wire dtype: ``out(s) = bytes per sample after layer
  s - 1 x batch`` for a split ``s`` (the server runs layers ``[0, s)``);
* the input size is the dataset's **stored** bytes per sample (what BASELINE transfers, e.g. JPEG)
  x batch, not the decoded tensor;
* candidates are splits ``1 <= s <= freeze`` with ``out(s) < input``; ``C = bandwidth x 1 s``;
* the winner is the earliest candidate with ``out(s) < C``; if none, the candidate with the
  smallest output (the earliest of equals). The thesis falls back to the freeze
  index, which can ship more than an earlier layer exactly where the link is tightest (AlexNet
  at 5 Mbit/s: 4.39 MB per batch at the freeze index against 3.14 MB at layer 8); we don't;
* if no split up to the freeze index is smaller than the input, nothing is pushed down
  (split 0 = raw streaming). This last rule is our extension: the thesis always pushes down.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from ..errors import ConfigurationError
from .decision import SplitDecision

__all__ = ["ProfileLike", "choose_split_index"]

log = logging.getLogger(__name__)


class _Layer(Protocol):
    output_bytes_per_sample: int


class ProfileLike(Protocol):
    @property
    def layers(self) -> Sequence[_Layer]: ...


def choose_split_index(
    profile: ProfileLike,
    input_bytes_per_sample: float,
    batch_size: int,
    bandwidth_bytes_per_s: float,
    freeze_index: int,
    *,
    wire_bytes_per_element: int = 4,
) -> SplitDecision:
    """The split index for one training run; see the module docstring for the rule."""
    n = len(profile.layers)
    if not 0 <= freeze_index <= n:
        raise ConfigurationError(f"freeze index {freeze_index} out of range [0, {n}]")
    if batch_size < 1:
        raise ConfigurationError(f"batch size must be >= 1, got {batch_size}")
    if input_bytes_per_sample <= 0:
        raise ConfigurationError("input bytes per sample must be positive")
    if bandwidth_bytes_per_s <= 0:
        raise ConfigurationError("bandwidth must be positive")
    scale = wire_bytes_per_element / 4  # profiles count float32 bytes
    input_size = input_bytes_per_sample * batch_size
    budget = bandwidth_bytes_per_s * 1.0

    def out(s: int) -> float:
        return profile.layers[s - 1].output_bytes_per_sample * scale * batch_size

    candidates = tuple(s for s in range(1, freeze_index + 1) if out(s) < input_size)
    if not candidates:
        decision = SplitDecision(
            0,
            f"no layer up to the freeze index {freeze_index} outputs less than the stored input "
            f"({input_size / 1e6:.2f} MB per batch): stream raw samples (split 0)",
            input_size,
            input_size,
            budget,
            candidates,
        )
    else:
        winner = next((s for s in candidates if out(s) < budget), None)
        if winner is None:
            smallest = min(candidates, key=lambda s: (out(s), s))
            decision = SplitDecision(
                smallest,
                f"no candidate fits the {budget / 1e6:.2f} MB that one second of bandwidth carries: "
                f"split where the least is shipped, layer {smallest} ({out(smallest) / 1e6:.2f} MB "
                f"per batch; the freeze index {freeze_index} ships {out(freeze_index) / 1e6:.2f} MB)",
                input_size,
                out(smallest),
                budget,
                candidates,
            )
        else:
            decision = SplitDecision(
                winner,
                f"earliest layer whose output ({out(winner) / 1e6:.2f} MB per batch) is below both the "
                f"stored input ({input_size / 1e6:.2f} MB) and one second of bandwidth ({budget / 1e6:.2f} MB)",
                input_size,
                out(winner),
                budget,
                candidates,
            )
    log.info("split index %d: %s", decision.split_index, decision.reason)
    return decision
