"""Unit tests of NNM, bucketing, clipping and Chain."""

from __future__ import annotations

import pytest
import torch

from hapi_client.robust import (
    Bucketing,
    Chain,
    Clipping,
    InvalidParameterError,
    Krum,
    Median,
    NearestNeighborMixing,
    RequirementError,
    get_aggregator,
)


def test_nnm_mixes_each_vector_with_its_nearest_neighbours() -> None:
    x = torch.tensor([[0.0], [1.0], [3.0], [10.0], [11.0]])
    out = NearestNeighborMixing(5, 2)(x)  # 3 nearest, self included
    expected = torch.tensor([[4 / 3], [4 / 3], [4 / 3], [8.0], [8.0]])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(NearestNeighborMixing(5, 0)(x), x.mean(dim=0).expand(5, 1))


def test_nnm_keeps_shape_and_passes_nonfinite_rows_through() -> None:
    x = torch.randn(6, 2, 3)
    x[4] = float("nan")
    out = NearestNeighborMixing(6, 1)(x)
    assert out.shape == x.shape
    assert bool(torch.isnan(out[4]).all())
    assert bool(torch.isfinite(out[[0, 1, 2, 3, 5]]).all())
    finite_mean = x[[0, 1, 2, 3, 5]].mean(dim=0)
    torch.testing.assert_close(out[0], finite_mean)  # the 5 finite ones are everyone's nearest


def test_nnm_requires_f_below_n() -> None:
    with pytest.raises(RequirementError):
        NearestNeighborMixing(3, 3)


def test_bucketing_averages_buckets_and_is_seeded() -> None:
    x = torch.arange(7, dtype=torch.float32).unsqueeze(1)
    step = Bucketing(7, s=2, seed=5)
    assert step.output_count == 4
    out = step(x)
    assert out.shape == (4, 1)
    # Every input lands in exactly one bucket: the bucket sums add up to the total.
    sizes = torch.tensor([2.0, 2.0, 2.0, 1.0])
    torch.testing.assert_close((out.squeeze(1) * sizes).sum(), x.sum())
    again = Bucketing(7, s=2, seed=5)(x)
    torch.testing.assert_close(out, again)
    outs = {tuple(Bucketing(7, s=2, seed=seed)(x).squeeze(1).tolist()) for seed in range(20)}
    assert len(outs) > 1  # different seeds shuffle differently
    with pytest.raises(InvalidParameterError):
        Bucketing(7, s=0)


def test_bucketing_confines_a_nonfinite_input_to_its_bucket() -> None:
    x = torch.ones(6, 3)
    x[2] = float("inf")
    out = Bucketing(6, s=3, seed=0)(x)
    finite = torch.isfinite(out).all(dim=1)
    assert int(finite.sum()) == 1


def test_clipping_bounds_norms_and_keeps_small_vectors() -> None:
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [float("nan"), 1.0]])
    out = Clipping(4, c=1.0)(x)
    torch.testing.assert_close(out[0], torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(out[1], x[1])
    torch.testing.assert_close(out[2], x[2])
    assert bool(torch.isnan(out[3, 0]))
    assert x[0, 0].item() == 3.0  # no in-place modification
    huge = torch.full((1, 4), 3e38)
    torch.testing.assert_close(
        Clipping(1, c=2.0)(huge), torch.full((1, 4), 1.0)
    )  # norm overflows float32, not the float64 one
    with pytest.raises(InvalidParameterError):
        Clipping(3, c=0.0)
    with pytest.raises(InvalidParameterError):
        Clipping(3, c=float("inf"))


def test_chain_runs_steps_in_order_and_checks_counts() -> None:
    chain = Chain(Clipping(7, c=1.0), Bucketing(7, s=2, seed=1), Median(4, 1))
    assert (chain.n, chain.f) == (7, 1)
    x = torch.randn(7, 5) * 10
    out = chain(x)
    assert out.shape == (5,)
    assert bool((out.abs() <= 1.0 + 1e-6).all())  # medians of means of clipped vectors
    with pytest.raises(RequirementError, match="outputs 4 vectors"):
        Chain(Bucketing(7, s=2), Median(7, 1))
    with pytest.raises(InvalidParameterError):
        Chain(Clipping(7))
    with pytest.raises(InvalidParameterError):
        Chain(Median(7, 1), Median(7, 1))


def test_chain_nnm_krum_resists_outliers() -> None:
    n, f = 11, 2
    gen = torch.Generator().manual_seed(0)
    honest = 1.0 + 0.1 * torch.randn(n - f, 20, generator=gen)
    x = torch.cat([torch.full((1, 20), 1e6), torch.full((1, 20), float("nan")), honest])
    chain = Chain(NearestNeighborMixing(n, f), Krum(n, f))
    out = chain(x)
    assert bool((out >= honest.min(dim=0).values).all())
    assert bool((out <= honest.max(dim=0).values).all())


def test_registry_builds_chains_with_bucket_counts() -> None:
    rule = get_aggregator("median", n=11, f=2, pre=["nnm", ("bucketing", {"s": 2, "seed": 3})])
    assert isinstance(rule, Chain)
    assert rule.rule.n == 6 and rule.n == 11
    with pytest.raises(RequirementError):
        # 11 inputs in buckets of 3 -> 4 vectors, too few for Krum with f=1 (needs 5).
        get_aggregator("krum", n=11, f=1, pre=[("bucketing", {"s": 3})])
