"""sorted_rows: the comparator network (CPU, n <= 32) and the fallbacks against torch.sort."""

from __future__ import annotations

import itertools

import pytest
import torch

from hapi_client.robust import _order, _tensors
from hapi_client.robust._order import NETWORK_MAX_N, _network, median_rows, sorted_rows


def _reference(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    inf = float("inf")
    return torch.nan_to_num(torch.sort(x, dim=0).values[lo:hi], nan=inf, posinf=inf, neginf=-inf)


def _windows(n: int) -> list[tuple[int, int]]:
    """The whole order, each median window and each trimmed-mean window."""
    out = {(0, n), (n // 2, n // 2 + 1), (max(n // 2 - 1, 0), n // 2 + 1)}
    out |= {(f, n - f) for f in range(1, (n + 1) // 2)}
    return sorted(out)


@pytest.mark.parametrize("n", range(1, 15))
def test_network_sorts_every_zero_one_input(n: int) -> None:
    # 0-1 principle: a comparator network that sorts all 2^n inputs of zeros and ones sorts
    # every input; the pruned networks must still place their window.
    x = torch.tensor(list(itertools.product([0.0, 1.0], repeat=n))).T.contiguous()
    for lo, hi in _windows(n):
        assert torch.equal(sorted_rows(x, lo, hi), _reference(x, lo, hi)), (lo, hi)


def test_pruning_keeps_only_what_the_window_needs() -> None:
    assert len(_network(17, 0, 17)) == 85  # Batcher's network for 32 wires, cut to 17
    assert len(_network(17, 8, 9)) < len(_network(17, 0, 17))
    assert _network(1, 0, 1) == ()


@pytest.mark.parametrize("n", [2, 3, 7, 16, 17, NETWORK_MAX_N, NETWORK_MAX_N + 1, 40])
@pytest.mark.parametrize("path", ["host", "blocks", "device"])
def test_random_values_with_nonfinite_match_sort(
    n: int, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # n > NETWORK_MAX_N takes topk on the CPU; "blocks" runs the network over blocks of 37
    # columns (the last one shorter); "device" takes the GPU's sort, on the CPU.
    if path == "blocks":
        monkeypatch.setattr(_order, "BLOCK_ABOVE_BYTES", 0)
        monkeypatch.setattr(_order, "BLOCK_COLUMNS", 37)
    if path == "device":
        monkeypatch.setattr(_tensors, "HOST_DEVICE_TYPES", frozenset())
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, 500, generator=gen, dtype=torch.float64)
    u = torch.rand(n, 500, generator=gen, dtype=torch.float64)
    x[u < 0.15] = float("nan")
    x[(u >= 0.15) & (u < 0.25)] = float("inf")
    x[(u >= 0.25) & (u < 0.35)] = float("-inf")
    x[(u >= 0.35) & (u < 0.45)] = 1.0  # ties
    before = x.clone()
    for lo, hi in _windows(n):
        got = sorted_rows(x, lo, hi)
        assert got.dtype == x.dtype and got.shape == (hi - lo, 500)
        assert torch.equal(got, _reference(x, lo, hi)), (lo, hi)
    assert torch.equal(x.isnan(), before.isnan())
    assert torch.equal(torch.nan_to_num(x), torch.nan_to_num(before))  # input untouched


def test_median_reads_nan_as_inf_and_keeps_no_input_storage() -> None:
    x = torch.tensor([[1.0, float("nan")], [2.0, float("nan")], [3.0, 5.0]])
    out = median_rows(x)
    assert out.tolist() == [2.0, float("inf")]
    assert out.untyped_storage().nbytes() == 2 * 4  # not a view of a larger work buffer
    even = median_rows(torch.tensor([[1.0], [2.0], [4.0], [float("nan")]]))
    assert even.tolist() == [3.0]
