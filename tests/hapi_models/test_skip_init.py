"""The skipped random init leaves every initialiser able to finish (models/skip_init.py)."""

from __future__ import annotations

import threading

import torch
from hapi_models.skip_init import skipped_random_init

OUT_OF_BOUNDS = 1e30  # what a recycled buffer may hold: far outside any initialiser's bounds


def test_a_skipped_draw_fills_its_tensor_with_a_value_of_its_range() -> None:
    normal = torch.full((64,), OUT_OF_BOUNDS)
    uniform = torch.full((64,), OUT_OF_BOUNDS)
    with skipped_random_init():
        normal.normal_(0.5, 2.0)
        uniform.uniform_(-0.25, 0.25)
    assert torch.equal(normal, torch.full((64,), 0.5))
    assert torch.equal(uniform, torch.full((64,), -0.25))


def test_a_skipped_draw_leaves_a_parameter_as_it_is() -> None:
    """The load sets a parameter: its memory is not written before (nor made resident)."""
    weight = torch.nn.Parameter(torch.full((64,), OUT_OF_BOUNDS))
    with skipped_random_init(), torch.no_grad():
        weight.normal_(0.5, 2.0)
    assert torch.equal(weight, torch.full((64,), OUT_OF_BOUNDS))


def test_trunc_normal_over_memory_out_of_its_bounds_finishes_within_them() -> None:
    """torch's trunc_normal_ redraws the out-of-bounds values of its parameter into a
    temporary until none is left: a temporary left holding recycled out-of-bounds memory never
    ended (ConvNeXt-L's build spun)."""
    weight = torch.nn.Parameter(torch.full((256, 256), OUT_OF_BOUNDS))
    done = threading.Event()

    def build() -> None:
        with skipped_random_init():  # a per-thread mode: entered on the worker thread
            torch.nn.init.trunc_normal_(weight, std=0.02)
        done.set()

    threading.Thread(target=build, daemon=True).start()
    assert done.wait(30), "trunc_normal_ did not finish under skipped_random_init"
    assert weight.abs().max() <= 2.0
