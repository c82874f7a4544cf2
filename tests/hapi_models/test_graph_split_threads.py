"""Cutting a network while another thread runs one: a server builds a model for one request
while it extracts features for another, so neither may disturb the other."""

from __future__ import annotations

import threading

import hapi_models as hm
import pytest
import torch
from torch import nn


class _Gate(nn.Module):
    """Holds the trace that runs through it until the test releases it."""

    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self.entered, self.release = entered, release

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        assert self.release.wait(120), "the test never released the trace"
        return x


@pytest.mark.parametrize("arch", ["resnet18", "tinycnn"])
def test_a_forward_in_another_thread_runs_while_a_network_is_cut(arch: str) -> None:
    running = hm.get_model(arch, num_classes=3)  # built (and, for tinycnn, traced) before
    entered, release = threading.Event(), threading.Event()
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), _Gate(entered, release), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)
    )
    failures: list[BaseException] = []

    def cut() -> None:
        try:
            hm.split_graph(net, "gated", (3, 8, 8))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)

    tracer = threading.Thread(target=cut)
    tracer.start()
    try:
        assert entered.wait(120), "the trace never reached the gate"
        with torch.no_grad():
            out = running(torch.randn(1, 3, 64, 64))
    finally:
        release.set()
        tracer.join(120)
    assert not failures, failures
    assert out.shape == (1, 3)
