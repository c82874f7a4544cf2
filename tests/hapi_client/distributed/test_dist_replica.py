"""Replica helpers: flat gradients in and out, and the checksum that proves replicas identical."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hapi_client.distributed import (
    flat_gradient,
    set_flat_gradient,
    state_checksum,
    trainable_parameters,
)


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    net[0].weight.requires_grad_(False)
    return net


def test_checksum_is_equal_for_identical_replicas_and_differs_after_one_ulp() -> None:
    a, b = _net(), _net()
    assert state_checksum(a.parameters()) == state_checksum(b.parameters())
    assert 0 <= state_checksum(a.parameters()) < 2**63  # fits an int64 tensor
    with torch.no_grad():
        p = next(iter(b[2].parameters()))
        p.view(-1)[0] = torch.nextafter(p.view(-1)[0], torch.tensor(1.0))
    assert state_checksum(a.parameters()) != state_checksum(b.parameters())


def test_checksum_depends_on_dtype_order_and_buffers() -> None:
    x = torch.arange(4.0)
    assert state_checksum([x]) != state_checksum([x.double()])
    assert state_checksum([x, x + 1]) != state_checksum([x + 1, x])
    net = _net()
    before = state_checksum(net.buffers())
    net.train()
    net(torch.randn(8, 4))  # batch norm updates its running statistics
    assert state_checksum(net.buffers()) != before


def test_same_update_on_two_replicas_keeps_them_identical() -> None:
    replicas = [_net(), _net()]
    optimizers = [torch.optim.SGD(trainable_parameters(r), lr=0.1, momentum=0.9) for r in replicas]
    for step in range(3):
        torch.manual_seed(step)
        update = torch.randn(sum(p.numel() for p in trainable_parameters(replicas[0])))
        for net, opt in zip(replicas, optimizers, strict=True):
            set_flat_gradient(trainable_parameters(net), update)
            opt.step()
    sums = [state_checksum(trainable_parameters(r)) for r in replicas]
    assert sums[0] == sums[1]
    assert sums[0] != state_checksum(trainable_parameters(_net()))


def test_flat_gradient_round_trip_skips_frozen_parameters() -> None:
    net = _net()
    params = trainable_parameters(net)
    assert all(p.requires_grad for p in params) and len(params) == len(list(net.parameters())) - 1
    net.train()
    net(torch.randn(5, 4)).sum().backward()
    flat = flat_gradient(params)
    assert flat.shape == (sum(p.numel() for p in params),) and flat.dtype == torch.float32
    set_flat_gradient(params, flat * 2)
    assert torch.allclose(flat_gradient(params), flat * 2)
    with pytest.raises(ValueError, match="flat gradient of 3 elements"):
        set_flat_gradient(params, torch.zeros(3))
    fresh = _net()
    assert torch.equal(
        flat_gradient(trainable_parameters(fresh)), torch.zeros_like(flat)
    )  # no .grad yet
