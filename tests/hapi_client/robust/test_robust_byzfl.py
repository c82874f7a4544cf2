"""Cross-checks against ByzFL (test-only dependency) where the definitions agree.

See the module docstring of ``hapi_client.robust.aggregators`` for the differences: ByzFL's
Krum uses the mean over n - f - 1 neighbours, so ByzFL ``Krum(f + 1)`` is compared with our
``Krum(n, f)`` and ByzFL ``MultiKrum(f + 1)`` with our ``MultiKrum(n, f, m=n - f - 1)``.
"""

from __future__ import annotations

import pytest
import torch

from hapi_client.robust import (
    MDA,
    Average,
    Clipping,
    Krum,
    Median,
    MultiKrum,
    NearestNeighborMixing,
    TrimmedMean,
)

byzfl = pytest.importorskip("byzfl")

CASES = [(7, 1, 0), (8, 2, 1), (11, 3, 2), (15, 4, 3)]


def sample(n: int, seed: int, d: int = 40) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    x[0] += 5.0  # one clear outlier so that selections are not near-ties
    return x


@pytest.mark.parametrize(("n", "f", "seed"), CASES)
def test_average_median_trimmed_mean(n: int, f: int, seed: int) -> None:
    x = sample(n, seed)
    torch.testing.assert_close(Average(n)(x), byzfl.Average()(x.clone()))
    torch.testing.assert_close(Median(n, f)(x), byzfl.Median()(x.clone()))  # even n: R5
    torch.testing.assert_close(TrimmedMean(n, f)(x), byzfl.TrMean(f=f)(x.clone()))


@pytest.mark.parametrize(("n", "f", "seed"), CASES)
def test_krum_and_multi_krum_with_matching_neighbour_count(n: int, f: int, seed: int) -> None:
    if n < 2 * f + 3:
        f = (n - 3) // 2
    x = sample(n, seed)
    torch.testing.assert_close(Krum(n, f)(x), byzfl.Krum(f=f + 1)(x.clone()))
    ours = MultiKrum(n, f, m=n - f - 1)(x)
    torch.testing.assert_close(ours, byzfl.MultiKrum(f=f + 1)(x.clone()))


@pytest.mark.parametrize(("n", "f", "seed"), [(5, 2, 0), (7, 3, 1), (8, 2, 2)])
def test_mda(n: int, f: int, seed: int) -> None:
    x = sample(n, seed, d=6)
    torch.testing.assert_close(MDA(n, f)(x), byzfl.MDA(f=f)(x.clone()))


@pytest.mark.parametrize(("n", "f", "seed"), CASES)
def test_nnm(n: int, f: int, seed: int) -> None:
    x = sample(n, seed)
    ours = NearestNeighborMixing(n, f)(x)
    torch.testing.assert_close(ours, byzfl.NNM(f=f)(x.clone()))


def test_clipping() -> None:
    x = sample(6, 4) * 3
    ours = Clipping(6, c=2.0)(x)
    theirs = byzfl.Clipping(c=2.0)(x.clone())  # ByzFL clips in place: give it a copy
    torch.testing.assert_close(ours, theirs)
