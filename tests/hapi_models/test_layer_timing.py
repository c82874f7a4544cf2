"""Per-layer timing as the layers run (``hapi_models.time_runs``), shared by the server's timing
request and the client's plan costs: each module timed in both layouts where its input has a
``channels_last`` form, once where it has not, a folded pair's time on its first layer."""

from __future__ import annotations

import hapi_models
import pytest
import torch
from torch import nn


class _Counted(nn.Module):
    """A layer that counts the samples it ran over and the layouts it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.samples = 0
        self.channels_last = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.samples += len(x)
        if x.dim() == 4 and not x.is_contiguous():
            self.channels_last += len(x)
        return x * 0.5


def test_layers_without_a_channels_last_form_are_timed_once() -> None:
    # A transformer's layers take tokens (3-d): their channels_last "form" is the same tensor,
    # and timing them in both layouts ran each twice for one answer.
    image_layer, token_layer = _Counted(), _Counted()
    runs = [(1, image_layer), (1, nn.Flatten(2)), (1, token_layer)]
    x = torch.rand(4, 3, 8, 8)
    with torch.inference_mode():
        per_sample = hapi_models.warm_up_runs(runs, x[:1], layouts=True)
        times, out = hapi_models.time_runs(runs, x, layouts=True)
    assert per_sample > 0
    # Warm-up: one sample per layout for the image layer, one for the token layer; then the
    # timed pass: both layouts for the image layer, one for the token layer.
    assert (image_layer.samples, image_layer.channels_last) == (2 + 2 * 4, 1 + 4)
    assert (token_layer.samples, token_layer.channels_last) == (1 + 4, 0)
    assert len(times) == 3 and all(t >= 0 for t in times)
    torch.testing.assert_close(out, (x * 0.25).flatten(2))


def test_a_module_standing_for_two_layers_times_the_first_and_reports_each_output() -> None:
    first, second = _Counted(), _Counted()
    seen: list[tuple[tuple[int, ...], int]] = []
    x = torch.rand(2, 3, 4, 4)
    with torch.inference_mode():
        times, out = hapi_models.time_runs(
            [(2, first), (1, second)],
            x,
            layouts=False,
            each=lambda y, count: seen.append((tuple(y.shape), count)),
        )
    assert len(times) == 3 and times[1] == 0.0 and times[0] > 0
    assert (first.channels_last, second.channels_last) == (0, 0)  # one layout asked
    assert seen == [((2, 3, 4, 4), 2), ((2, 3, 4, 4), 1)]
    torch.testing.assert_close(out, x * 0.25)


@pytest.mark.parametrize(
    ("per_sample", "expected"), [(None, 16), (0.0, 16), (0.01, 16), (0.25, 4), (1.5, 2)]
)
def test_a_heavy_head_is_timed_over_fewer_samples(per_sample: float | None, expected: int) -> None:
    # Unknown cost: every sample; else a timed pass of about TIMED_PASS_S, never under two.
    assert hapi_models.timed_samples(per_sample, 16) == expected
    assert hapi_models.timed_samples(per_sample, 1) == 1
    assert hapi_models.timed_samples(per_sample, 2) == min(expected, 2)
