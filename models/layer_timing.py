"""A head's layers timed one at a time, as they run: the one timing both sides of a plan use.

The split rule compares the server's layers with the client's (``split="auto"``): a layer the
server times folded and in its faster layout must not be timed contiguous and unfolded by the
client, or every layer looks cheaper on the server than where it would run. EfficientNet-Lite0's
head ran 2.56x faster in ``channels_last`` and a third of its time went to batch norms that
folding removes (issue 30), and the client runs its frozen layers folded and in its chosen layout
as the server does; timed the old way its layers cost several times what they cost when run. So
the HAPI server's timing request (``hapi_core.timing``) and the client's cost measurement
(``hapi_client.planning.costs``) both time through here: the modules a
:class:`~hapi_models.BatchNormFolder` runs (a folded convolution and norm timed as one, on the
convolution), each on a contiguous and on a ``channels_last`` input, the faster kept (once where
the input has no ``channels_last`` form: a transformer's tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from .layout import to_layout

__all__ = [
    "MIN_TIMED_SAMPLES",
    "TIMED_PASS_S",
    "WARM_UP_SAMPLES",
    "Runs",
    "sync",
    "time_runs",
    "timed_samples",
    "warm_up_runs",
]

#: What a :class:`~hapi_models.BatchNormFolder` runs for some layers: per module, how many
#: layers it stands for (2 for a folded convolution and norm) and the module.
Runs = Sequence[tuple[int, nn.Module]]
Turn = Callable[[], AbstractContextManager[None]]

#: Samples of the untimed warm-up pass: one sample runs every layer's kernels and allocations
#: once, which is what the warm-up is for; each further sample only added to a cold plan.
WARM_UP_SAMPLES = 1
#: Seconds the timed pass may take: a head slower than this per sample is timed over fewer
#: samples, never fewer than ``MIN_TIMED_SAMPLES``. A head that heavy runs large tensors through
#: every layer, so its per-sample time at 2 samples is its time at a larger batch within the
#: noise of a shared host; more samples cost a cold plan seconds (ViT-B/16 on a 2-core CPU:
#: half a second or more each, on both the client and the server) for no better decision.
TIMED_PASS_S = 1.0
MIN_TIMED_SAMPLES = 2


def timed_samples(per_sample_s: float | None, available: int) -> int:
    """How many of ``available`` samples to time a head of ``per_sample_s`` seconds per sample
    over (all of them when its cost is unknown)."""
    if per_sample_s is None or per_sample_s <= 0:
        return available
    fits = int(TIMED_PASS_S / per_sample_s)
    return max(1, min(available, max(MIN_TIMED_SAMPLES, fits)))


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA kernel returns before it ran)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up_runs(runs: Runs, x: torch.Tensor, *, layouts: bool, turn: Turn = nullcontext) -> float:
    """Run ``x`` (a sample or a few) through ``runs``, in ``channels_last`` too with ``layouts``
    as far as the tensors have that form, to warm the kernels and the allocator; the contiguous
    pass's seconds per sample (a first pass: an overestimate). Under inference mode."""
    with turn():
        sync(x.device)
        start = time.perf_counter()
        y = x
        for _, module in runs:
            y = module(y)
        sync(x.device)
        per_sample = (time.perf_counter() - start) / len(x)
        if layouts:
            y = x
            for _, module in runs:
                if y.dim() != 4:
                    break  # no channels_last form from here: warmed above
                y = module(to_layout(y, True))
            sync(x.device)
    return per_sample


def time_runs(
    runs: Runs,
    x: torch.Tensor,
    *,
    layouts: bool,
    turn: Turn = nullcontext,
    each: Callable[[torch.Tensor, int], None] | None = None,
) -> tuple[list[float], torch.Tensor]:
    """Seconds per sample of each layer of ``runs`` over ``x``, one module at a time, and the
    last output. A module standing for several layers gives its time to the first of them and 0
    to the others. With ``layouts`` each module is timed on a contiguous and on a
    ``channels_last`` input, the faster kept; its contiguous output feeds the next. Each module's
    timing holds ``turn`` (the server's turn at a CPU's cores); ``each(output, layers)`` is called
    after it, outside the turn (the server times its encoding there)."""
    n = len(x)
    shapes = (False, True) if layouts else (False,)
    times: list[float] = []
    for count, module in runs:
        seconds = []
        with turn():
            for channels_last in shapes:
                if channels_last and x.dim() != 4:
                    # No channels_last form (a transformer's tokens): the same run twice
                    # doubled a ViT-B/16 plan's timing for nothing.
                    continue
                given = to_layout(x, channels_last)
                sync(x.device)
                start = time.perf_counter()
                out = module(given)
                sync(x.device)
                seconds.append((time.perf_counter() - start) / n)
                if not channels_last:
                    y = out
            del given, out
        x = y.contiguous()
        times += [min(seconds)] + [0.0] * (count - 1)
        if each is not None:
            each(x, count)
    return times, x
