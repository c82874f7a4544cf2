"""channels_last per head: chosen once per key, and equal to the contiguous head within float
tolerance (a different kernel, not a different function)."""

from __future__ import annotations

import hapi_models
import pytest
import torch

from hapi_core.layout import LayoutChooser, to_layout

# Convolutions reordered for another layout round differently; features agree to float32 noise.
CLOSE = {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.parametrize(("arch", "split"), [("efficientnet_lite0", 9), ("resnet18", 5)])
def test_a_head_on_a_channels_last_input_gives_the_same_features(arch: str, split: int) -> None:
    torch.manual_seed(0)
    head = hapi_models.get_model(arch, num_classes=10).head(split)
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        plain = head(x)
        last = head(to_layout(x, True))
        chosen = LayoutChooser().forward((arch, split), head, x)
    torch.testing.assert_close(last, plain, **CLOSE)
    torch.testing.assert_close(chosen, plain, **CLOSE)


def test_the_choice_is_measured_once_per_key_and_kept() -> None:
    calls: list[torch.Tensor] = []

    def head(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x * 2

    chooser = LayoutChooser()
    x = torch.ones(1, 3, 4, 4)
    assert chooser.known("k") is None
    assert chooser.forward("k", head, x).equal(x * 2)
    assert chooser.known("k") in (True, False)
    measured = len(calls)
    assert measured == 4  # two runs per layout
    chooser.forward("k", head, x)
    assert len(calls) == measured + 1


def test_off_or_not_an_image_batch_runs_the_head_as_given() -> None:
    calls: list[torch.Tensor] = []

    def head(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x

    LayoutChooser(enabled=False).forward("k", head, torch.ones(1, 3, 4, 4))
    LayoutChooser().forward("k", head, torch.ones(3, 4))
    assert len(calls) == 2 and all(c.is_contiguous() for c in calls)
