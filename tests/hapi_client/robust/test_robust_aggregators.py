"""Unit tests of the aggregation rules, with oracles that can fail."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from hapi_client.robust import (
    MDA,
    Aggregator,
    Average,
    BatchWeightedAverage,
    Bulyan,
    ComplexityLimitError,
    InputMismatchError,
    InvalidParameterError,
    Krum,
    Median,
    MultiKrum,
    NonFiniteInputError,
    RequirementError,
    RobustAggregationError,
    TrimmedMean,
    aggregator_class,
    get_aggregator,
    list_aggregators,
)
from hapi_client.robust._distances import pairwise_sq_distances

ROBUST = ["median", "trimmed_mean", "krum", "multi_krum", "mda", "bulyan"]
ALL = sorted(list_aggregators())

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


def honest_cluster(h: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 1.0 + 0.1 * torch.randn(h, *shape, generator=gen)


def build(name: str, n: int, f: int | None = None) -> object:
    """A rule for n inputs with f = the largest f the rule tolerates (unless given)."""
    if f is None:
        f = aggregator_class(name).max_f(n)
    return get_aggregator(name, n=n, f=f)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ALL)
def test_identical_inputs_return_that_input(name: str, device: str) -> None:
    x = torch.linspace(-3, 3, 24, device=device).reshape(2, 3, 4)
    n = 11
    rule = build(name, n)
    out = rule([x.clone() for _ in range(n)])  # type: ignore[operator]
    assert out.shape == x.shape
    assert out.device == x.device
    assert out.dtype == x.dtype
    torch.testing.assert_close(out, x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ROBUST)
@pytest.mark.parametrize("n", [7, 11])
def test_outliers_do_not_move_robust_rules_out_of_honest_range(
    name: str, n: int, device: str
) -> None:
    f = aggregator_class(name).max_f(n)
    honest = honest_cluster(n - f, (50,)).to(device)
    signs = [1.0 if i % 2 == 0 else -1.0 for i in range(f)]
    outliers = [torch.full((50,), 1e6 * s, device=device) for s in signs]
    out = get_aggregator(name, n=n, f=f)([*outliers, *honest])  # outliers first on purpose
    low, high = honest.min(dim=0).values, honest.max(dim=0).values
    assert torch.isfinite(out).all()
    assert bool((out >= low - 1e-6).all()) and bool((out <= high + 1e-6).all())


def test_average_is_dragged_by_outliers() -> None:
    n, f = 11, 2
    honest = honest_cluster(n - f, (50,))
    outliers = [torch.full((50,), 1e6) for _ in range(f)]
    out = Average(n, f)([*honest, *outliers])
    assert bool((out > honest.max(dim=0).values + 1e3).all())


@pytest.mark.parametrize("name", ROBUST)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "mixed", "partial"])
def test_at_most_f_nonfinite_inputs_give_finite_output(name: str, bad: str) -> None:
    n = 11
    f = aggregator_class(name).max_f(n)
    honest = honest_cluster(n - f, (30,))
    poisoned = []
    for i in range(f):
        v = torch.zeros(30)
        if bad == "nan":
            v[:] = float("nan")
        elif bad == "inf":
            v[:] = float("inf")
        elif bad == "-inf":
            v[:] = float("-inf")
        elif bad == "mixed":
            v[:] = [float("nan"), float("inf"), float("-inf")][i % 3]
        else:  # an otherwise plausible vector with one bad coordinate
            v = honest[0].clone()
            v[i % 30] = float("nan")
        poisoned.append(v)
    inputs = [*honest[:2], *poisoned, *honest[2:]]
    out = get_aggregator(name, n=n, f=f)(inputs)
    assert bool(torch.isfinite(out).all())
    low, high = honest.min(dim=0).values, honest.max(dim=0).values
    assert bool((out >= low - 1e-6).all()) and bool((out <= high + 1e-6).all())


@pytest.mark.parametrize("name", ["krum", "multi_krum", "mda", "bulyan"])
def test_distance_rules_never_select_a_nonfinite_input(name: str) -> None:
    n = 11
    f = aggregator_class(name).max_f(n)
    honest = honest_cluster(n - f, (8,))
    inputs = [torch.full((8,), float("nan")) for _ in range(f)] + list(honest)
    rule = get_aggregator(name, n=n, f=f)
    chosen = rule.select(inputs)  # type: ignore[attr-defined]
    assert all(i >= f for i in chosen), chosen


def test_average_refuses_nonfinite_by_default_and_names_the_input() -> None:
    x = [torch.ones(4), torch.tensor([1.0, float("nan"), 1.0, 1.0]), torch.ones(4)]
    with pytest.raises(NonFiniteInputError, match=r"\[1\]"):
        Average(3)(x)
    out = Average(3, nonfinite="propagate")(x)
    assert bool(torch.isnan(out[1])) and out[0].item() == 1.0
    with pytest.raises(NonFiniteInputError):
        BatchWeightedAverage(3)(x, batch_sizes=[1, 1, 1])
    with pytest.raises(InvalidParameterError):
        Average(3, nonfinite="ignore")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ALL)
def test_list_and_stacked_inputs_agree(name: str) -> None:
    n = 7
    x = honest_cluster(n, (3, 5), seed=3)
    rule = build(name, n)
    torch.testing.assert_close(rule(list(x)), rule(x))  # type: ignore[operator]


@pytest.mark.parametrize("name", ALL)
def test_output_is_new_and_inputs_untouched(name: str) -> None:
    n = 7
    x = honest_cluster(n, (6,), seed=4)
    x[0] += 50.0
    before = x.clone()
    out = build(name, n)(x)  # type: ignore[operator]
    out.add_(1000.0)
    torch.testing.assert_close(x, before, rtol=0, atol=0)


def test_half_precision_in_half_precision_out() -> None:
    x = honest_cluster(7, (10,)).half()
    for name in ALL:
        out = build(name, 7)(x)  # type: ignore[operator]
        assert out.dtype == torch.float16
        assert bool(torch.isfinite(out).all())


def test_scalar_elements_stacked_as_a_vector() -> None:
    out = Median(5, 2)(torch.tensor([1.0, 9.0, 3.0, -7.0, 4.0]))
    assert out.shape == torch.Size([])
    assert out.item() == 3.0


@pytest.mark.parametrize(
    ("cls", "n", "f"),
    [
        (Median, 4, 2),
        (TrimmedMean, 6, 3),
        (Krum, 6, 2),
        (MultiKrum, 8, 3),
        (MDA, 4, 2),
        (Bulyan, 10, 2),
        (Bulyan, 6, 1),
        (Average, 2, 2),
    ],
)
def test_requirement_violations_raise(cls: type[Aggregator], n: int, f: int) -> None:
    with pytest.raises(RequirementError, match=cls.requirement.replace("+", r"\+")) as info:
        cls(n, f)
    assert isinstance(info.value, RobustAggregationError)
    assert cls.check(n, f) is not None
    assert cls.check(cls.min_n(f), f) is None


def test_requirements_match_the_seeds() -> None:
    assert (Median.min_n(3), Krum.min_n(3), MultiKrum.min_n(3)) == (7, 9, 9)
    assert (MDA.min_n(3), Bulyan.min_n(3), TrimmedMean.min_n(3)) == (7, 15, 7)
    assert Bulyan.max_f(7) == 1 and Bulyan.max_f(15) == 3 and Krum.max_f(11) == 4
    Krum(9, 3)
    Bulyan(15, 3)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_n_or_f_types(bad: object) -> None:
    with pytest.raises(InvalidParameterError):
        Median(7, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        Median(bad, 0)  # type: ignore[arg-type]


def test_call_validation() -> None:
    rule = Median(5, 1)
    with pytest.raises(InputMismatchError, match="expected n=5 inputs, got 4"):
        rule([torch.ones(3)] * 4)
    with pytest.raises(InputMismatchError, match="shape"):
        rule([torch.ones(3)] * 4 + [torch.ones(4)])
    with pytest.raises(InputMismatchError, match="dtype"):
        rule([torch.ones(3)] * 4 + [torch.ones(3, dtype=torch.float64)])
    with pytest.raises(InputMismatchError, match="gather_replies"):
        rule([torch.ones(3)] * 4 + [None])  # type: ignore[list-item]
    with pytest.raises(InputMismatchError, match="floating"):
        rule(torch.ones(5, 3, dtype=torch.int64))
    with pytest.raises(InputMismatchError):
        rule([])
    with pytest.raises(InputMismatchError):
        rule(torch.tensor(1.0))


def test_median_even_count_is_mean_of_two_middle_values() -> None:
    x = torch.tensor([[4.0, -1.0], [1.0, 2.0], [10.0, 8.0], [2.0, 6.0]])
    # sorted columns: (1, 2, 4, 10) -> 3.0 and (-1, 2, 6, 8) -> 4.0 (reading R5 of docs/references.md, not torch's lower one)
    torch.testing.assert_close(Median(4, 1)(x), torch.tensor([3.0, 4.0]))
    y = torch.randn(6, 101)
    np.testing.assert_allclose(Median(6, 2)(y).numpy(), np.median(y.numpy(), axis=0), rtol=1e-6)
    z = torch.randn(7, 101)
    np.testing.assert_allclose(Median(7, 3)(z).numpy(), np.median(z.numpy(), axis=0), rtol=1e-6)


def test_trimmed_mean_drops_f_from_each_end() -> None:
    x = torch.tensor([[1.0], [2.0], [3.0], [100.0], [-100.0], [4.0], [5.0]])
    torch.testing.assert_close(TrimmedMean(7, 2)(x), torch.tensor([3.0]))
    torch.testing.assert_close(TrimmedMean(7, 0)(x), x.mean(dim=0))


def test_krum_scores_use_squared_distances() -> None:
    # 1-D points where the squared-distance score (thesis eq. (3.7), reading R7) picks 3.0 while a plain l2
    # score would pick 16.0 (n=5, f=1 -> 2 neighbours).
    x = torch.tensor([[0.0], [3.0], [9.0], [16.0], [17.0]])
    rule = Krum(5, 1)
    assert rule.select(x) == [1]
    torch.testing.assert_close(rule(x), torch.tensor([3.0]))


def test_multi_krum_default_m_and_average_of_selection() -> None:
    rule = MultiKrum(7, 1)
    assert rule.m == 4  # n - f - 2 (reading R8)
    x = torch.tensor([[0.0], [0.1], [0.2], [0.3], [5.0], [-7.0], [30.0]])
    assert sorted(rule.select(x)) == [0, 1, 2, 3]
    torch.testing.assert_close(rule(x), torch.tensor([0.15]))
    assert MultiKrum(7, 1, m=2).select(x) == [3, 2]  # best score first
    with pytest.raises(InvalidParameterError):
        MultiKrum(7, 1, m=8)


def _reference_mda(x: np.ndarray, f: int) -> np.ndarray:
    n = len(x)
    best: tuple[int, ...] | None = None
    best_diam = float("inf")
    for subset in itertools.combinations(range(n), n - f):
        diam = max(
            (float(np.linalg.norm(x[i] - x[j])) for i, j in itertools.combinations(subset, 2)),
            default=0.0,
        )
        if diam < best_diam:
            best, best_diam = subset, diam
    assert best is not None
    return x[list(best)].mean(axis=0)


@pytest.mark.parametrize(("n", "f", "seed"), [(5, 2, 0), (7, 3, 1), (8, 2, 2), (6, 0, 3)])
def test_mda_matches_brute_force(n: int, f: int, seed: int) -> None:
    x = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float64)
    out = MDA(n, f)(torch.from_numpy(x))
    np.testing.assert_allclose(out.numpy(), _reference_mda(x, f), rtol=1e-9)


def test_mda_refuses_huge_searches() -> None:
    with pytest.raises(ComplexityLimitError, match=r"C\(40, 19\)"):
        MDA(40, 19)
    assert MDA(40, 2).subsets == 780
    with pytest.raises(ComplexityLimitError):
        MDA(12, 5, max_subsets=100)


def _reference_bulyan_picks(x: np.ndarray, f: int) -> list[int]:
    """Phase 1 of thesis Algorithm 1 as a straight loop, Krum (>= 1 neighbour) inside."""
    n = len(x)
    theta = n - 2 * f
    remaining = list(range(n))
    selected: list[int] = []
    for _ in range(theta):
        r = len(remaining)
        k = min(max(r - f - 2, 1), r - 1)
        scores = []
        for i in remaining:
            d = sorted(float(np.sum((x[i] - x[j]) ** 2)) for j in remaining if j != i)
            scores.append(sum(d[:k]))
        best = remaining[int(np.argmin(scores))]  # first minimum: ties go to the lower index
        selected.append(best)
        remaining.remove(best)
    return selected


def _reference_bulyan(x: np.ndarray, f: int) -> np.ndarray:
    """Thesis Algorithm 1: the picks above, then phase 2 over them in input order."""
    beta = len(x) - 4 * f
    sel = x[sorted(_reference_bulyan_picks(x, f))]
    out = np.empty(x.shape[1])
    for j in range(x.shape[1]):
        med = np.median(sel[:, j])
        closest = np.argsort(np.abs(sel[:, j] - med), kind="stable")[:beta]
        out[j] = sel[closest, j].mean()
    return out


@pytest.mark.parametrize(("n", "f", "seed"), [(7, 1, 0), (11, 2, 1), (15, 3, 2), (8, 1, 3)])
def test_bulyan_matches_reference_loop(n: int, f: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 9))
    x[:f] += 20.0 * rng.normal(size=(f, 9))
    out = Bulyan(n, f)(torch.from_numpy(x))
    np.testing.assert_allclose(out.numpy(), _reference_bulyan(x, f), rtol=1e-9)


def test_bulyan_selection_and_counts() -> None:
    rule = Bulyan(11, 2)
    x = torch.cat([torch.full((2, 3), 1e6), honest_cluster(9, (3,))])
    picks = rule.select(x)
    assert len(picks) == 7 and len(set(picks)) == 7  # theta = n - 2f
    # Two colluding identical outliers win the last Krum rounds (the few honest vectors left are
    # farther apart than the outliers are from each other); phase 2 must still drop them.
    assert sum(p < 2 for p in picks) <= 2
    out = rule(x)
    honest = x[2:]
    assert bool((out >= honest.min(dim=0).values).all())
    assert bool((out <= honest.max(dim=0).values).all())


def test_batch_weighted_average() -> None:
    x = torch.tensor([[1.0, 0.0], [3.0, 4.0], [5.0, 8.0]])
    rule = BatchWeightedAverage(3, batch_sizes=[1, 1, 2])
    torch.testing.assert_close(rule(x), torch.tensor([3.5, 5.0]))
    torch.testing.assert_close(rule(x, batch_sizes=[0, 0, 7]), torch.tensor([5.0, 8.0]))
    torch.testing.assert_close(BatchWeightedAverage(3)(x), x.mean(dim=0))
    with pytest.raises(InputMismatchError, match="3 batch sizes"):
        rule(x, batch_sizes=[1, 2])
    with pytest.raises(InputMismatchError):
        rule(x, batch_sizes=[1, -1, 2])
    with pytest.raises(InputMismatchError):
        rule(x, batch_sizes=[0, 0, 0])


def test_rules_do_not_track_gradients() -> None:
    x = honest_cluster(7, (4,)).requires_grad_(True)
    for name in ALL:
        out = build(name, 7)(x)  # type: ignore[operator]
        assert not out.requires_grad


def test_repr_names_parameters() -> None:
    assert repr(Krum(7, 2)) == "Krum(n=7, f=2, m=1)"
    assert repr(Bulyan(7, 1)) == "Bulyan(n=7, f=1)"


def _offset_inputs(n: int, d: int, seed: int) -> torch.Tensor:
    """A large common offset, an outlier in row 0 and honest rows of clearly different spread.

    The offset and the outlier are the worst case for the ``|a|^2 + |b|^2 - 2ab`` expansion.
    Row i's noise scale grows by 10 % per row, so Krum scores differ by several percent between
    rows: far above float32's resolution of the distances (about 1e-5 relative, see
    test_float32_distances_are_symmetric_and_accurate), so the rule's choice is well defined.
    """
    gen = torch.Generator().manual_seed(seed)
    scale = 0.01 * (1.0 + 0.1 * torch.arange(n, dtype=torch.float64)).unsqueeze(1)
    x = 1000.0 + scale * torch.randn(n, d, generator=gen, dtype=torch.float64)
    x[0] = 1e6
    return x.float()  # the float64 run below sees exactly the same (rounded) inputs


def test_float32_distances_are_symmetric_and_accurate() -> None:
    x32 = _offset_inputs(11, 100_000, seed=9)
    finite = torch.ones(11, dtype=torch.bool)
    d32 = pairwise_sq_distances(x32, finite)
    d64 = pairwise_sq_distances(x32.double(), finite)
    assert torch.equal(d32, d32.T)  # exactly, whatever the BLAS kernel
    # Honest pairs: centred float32 dot products over d = 1e5 terms; blocked summation keeps
    # the error near sqrt(d) * 2^-24 ~ 2e-5 relative to |c|^2 (same order as the distances).
    honest32, honest64 = d32[1:, 1:].double(), d64[1:, 1:]
    torch.testing.assert_close(honest32, honest64, rtol=2e-4, atol=0.0)


@pytest.mark.parametrize("seed", [9, 10, 11])
@pytest.mark.parametrize("name", ["krum", "multi_krum", "bulyan"])
def test_float32_selection_matches_float64_with_offset_and_outlier_first(
    name: str, seed: int
) -> None:
    x32 = _offset_inputs(11, 100_000, seed)
    rule = get_aggregator(name, n=11, f=2)
    chosen32 = rule.select(x32)  # type: ignore[attr-defined]
    chosen64 = rule.select(x32.double())  # type: ignore[attr-defined]
    # The rule promises a set (Multi-Krum averages it; Bulyan's phase 2 sees it unordered).
    assert sorted(chosen32) == sorted(chosen64)
    assert 0 not in chosen32 or name == "bulyan"
    # Same set, so the outputs differ only by float32 rounding of a mean of ~1000-sized values.
    out32, out64 = rule(x32), rule(x32.double())  # type: ignore[operator]
    torch.testing.assert_close(out32.double(), out64, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize(("n", "f"), [(3, 0), (7, 1), (11, 2)])
def test_bulyan_picks_match_reference_loop_on_random_inputs(n: int, f: int) -> None:
    # At n = 4f+3 the last Krum rounds compare the two scores of one pair, d(i, j) and d(j, i):
    # an exact tie that must go to the lower index (as the reference's argmin over an index-
    # ordered list does), not to whichever half of the matrix rounded lower.
    rng = np.random.default_rng(1234)
    for _ in range(100):
        x = rng.normal(size=(n, 33))
        assert Bulyan(n, f).select(torch.from_numpy(x)) == _reference_bulyan_picks(x, f)


def test_ties_break_by_index() -> None:
    # Four vectors on a square (and its centre): Krum scores and distances tie exactly.
    square = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0], [0.0, 0.0]])
    assert Krum(4, 0).select(square[:4]) == [0]
    assert Krum(4, 0).select(square[[2, 3, 0, 1]]) == [0]
    assert MultiKrum(5, 1, m=3).select(square[[1, 0, 3, 2, 4]]) == [4, 0, 1]
    # Bulyan(7, 1) keeps {3, 1, 0, -1, 10}; phase 2 keeps beta = 3 values around the median 1:
    # 1, 0, and one of -1 and 3 (both 2 away). The lower input index wins, whatever order
    # Krum selected them in.
    x = torch.tensor([[0.0], [1.0], [-1.0], [3.0], [10.0], [100.0], [200.0]], dtype=torch.float64)
    assert sorted(Bulyan(7, 1).select(x)) == [0, 1, 2, 3, 4]
    assert Bulyan(7, 1)(x).item() == 0.0  # -1 (index 2) kept
    assert Bulyan(7, 1)(x[[0, 1, 3, 2, 4, 5, 6]]).item() == pytest.approx(4.0 / 3.0)  # 3 kept
