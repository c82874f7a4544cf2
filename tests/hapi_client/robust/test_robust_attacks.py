"""Unit tests of the attacks, of dropped replies and of the by-name registries."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest
import torch

from hapi_client.robust import (
    ALittleIsEnough,
    DropAttack,
    FallOfEmpires,
    InputMismatchError,
    InvalidParameterError,
    MissingRepliesError,
    NonFiniteAttack,
    RandomAttack,
    ReverseAttack,
    UnknownNameError,
    aggregator_class,
    alie_z_max,
    gather_replies,
    get_aggregator,
    get_attack,
    get_preaggregator,
    list_aggregators,
    list_attacks,
    list_preaggregators,
)


def sent(replies: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """The forged replies, checked to be tensors (every attack but "drop" sends one)."""
    out = [r for r in replies if r is not None]
    assert len(out) == len(replies)
    return out


def honest(h: int = 8, d: int = 200, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 0.5 + torch.randn(h, d, generator=gen)


def test_reverse_is_minus_100_times_own_gradient() -> None:
    g = honest(4, 10)
    forged = ReverseAttack(n_byzantine=6)(list(g))
    assert len(forged) == 6
    for j, v in enumerate(forged):
        assert v is not None
        torch.testing.assert_close(v, -100.0 * g[j % 4])
    forged2 = ReverseAttack(2, factor=-3.0)(g)
    assert forged2[0] is not None
    torch.testing.assert_close(forged2[0], -3.0 * g[0])


def test_random_is_seeded_and_shaped() -> None:
    g = honest(3, 12).reshape(3, 3, 4)
    a = RandomAttack(2, seed=7, std=2.0)(g)
    b = RandomAttack(2, seed=7, std=2.0)(g)
    c = RandomAttack(2, seed=8, std=2.0)(g)
    assert all(v is not None and v.shape == (3, 4) for v in a)
    torch.testing.assert_close(a[0], b[0])
    assert not torch.equal(a[0], c[0])  # type: ignore[arg-type]
    assert not torch.equal(a[0], a[1])  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        RandomAttack(1, std=-1.0)


def test_alie_z_max_follows_the_normal_cdf_formula() -> None:
    # n = 50 workers, m = 12 Byzantine: s = floor(50/2 + 1) - 12 = 14, Phi(z) < 36/50.
    z = alie_z_max(50, 12)
    assert math.isclose(z, NormalDist().inv_cdf(36 / 50))
    assert 0.58 < z < 0.59
    assert math.isclose(alie_z_max(11, 3), NormalDist().inv_cdf(8 / 11))
    with pytest.raises(InvalidParameterError):
        alie_z_max(10, 7)  # s = 6 - 7 < 0: the attackers are a majority, (n - s)/n > 1


def test_alie_sends_mean_minus_z_std_within_the_honest_spread() -> None:
    g = honest(8, 500, seed=1)
    attack = ALittleIsEnough(n_byzantine=3)
    forged = attack(g)
    z = alie_z_max(11, 3)
    expected = g.mean(dim=0) - z * g.std(dim=0)
    assert len(forged) == 3
    for v in forged:
        assert v is not None
        torch.testing.assert_close(v, expected)
    low, high = g.min(dim=0).values, g.max(dim=0).values
    v = forged[0]
    assert v is not None
    assert bool((v > low).all()) and bool((v < high).all())
    fixed = ALittleIsEnough(1, z=1.5)(g)[0]
    assert fixed is not None
    torch.testing.assert_close(fixed, g.mean(dim=0) - 1.5 * g.std(dim=0))
    with pytest.raises(InputMismatchError):
        attack(g[:1])


def test_fall_of_empires_is_minus_epsilon_mean() -> None:
    g = honest(5, 30)
    for v in FallOfEmpires(2)(g):
        assert v is not None
        torch.testing.assert_close(v, -0.1 * g.mean(dim=0))
    v = FallOfEmpires(1, epsilon=10.0)(g)[0]
    assert v is not None
    torch.testing.assert_close(v, -10.0 * g.mean(dim=0))


def test_nonfinite_attack() -> None:
    g = honest(3, 4)
    v = NonFiniteAttack(1, value=float("-inf"))(g)[0]
    assert v is not None and bool(torch.isneginf(v).all())
    with pytest.raises(InvalidParameterError):
        NonFiniteAttack(1, value=1.0)


def test_drop_sends_nothing_and_server_waits_for_q_of_n() -> None:
    g = list(honest(8, 16))
    replies = [*g[:3], *DropAttack(3)(g), *g[3:]]
    assert replies.count(None) == 3 and len(replies) == 11
    q = 8
    got = gather_replies(replies, q)
    assert len(got) == q and all(r is not None for r in got)
    out = get_aggregator("median", n=q, f=2)(got)
    assert bool(torch.isfinite(out).all())
    with pytest.raises(MissingRepliesError, match="only 8 of 11"):
        gather_replies(replies, 9)
    assert len(gather_replies(iter(replies), 5)) == 5  # stops at the fastest q
    with pytest.raises(InvalidParameterError):
        gather_replies(replies, 0)


def test_attack_output_follows_honest_dtype_and_device() -> None:
    g = honest(4, 6).double()
    for name in list_attacks():
        params: dict[str, object] = {"n_byzantine": 2, "seed": 1}
        for v in get_attack(name, **params)(g):
            if v is not None:
                assert v.dtype == torch.float64 and v.device == g.device and v.shape == (6,)
    assert get_attack("alie", n_byzantine=0)(g) == []


@pytest.mark.parametrize("rule_name", ["median", "trimmed_mean", "krum", "multi_krum", "bulyan"])
@pytest.mark.parametrize("attack_name", ["random", "reverse", "alie", "foe", "nonfinite"])
def test_robust_rules_under_each_attack_stay_finite(rule_name: str, attack_name: str) -> None:
    n = 11
    f = min(aggregator_class(rule_name).max_f(n), 2)
    g = honest(n - f, 64, seed=2)
    forged = get_attack(attack_name, n_byzantine=f, seed=0)(g)
    out = get_aggregator(rule_name, n=n, f=f)([*sent(forged), *g])
    assert out.shape == (64,)
    assert bool(torch.isfinite(out).all())
    if attack_name == "reverse":  # far outliers: the result must be in the honest box
        assert bool((out >= g.min(dim=0).values).all())
        assert bool((out <= g.max(dim=0).values).all())


def test_declared_f_is_separate_from_real_attackers() -> None:
    n = 11
    g = honest(n, 32, seed=3)
    rule = get_aggregator("median", n=n, f=3)  # declared f = 3
    # Fewer real attackers than declared: fine.
    two = ReverseAttack(2)(g[:9])
    out = rule([*sent(two), *g[:9]])
    assert bool((out <= g[:9].max(dim=0).values).all())
    # More real attackers than the rule can tolerate (6 of 11): the median is captured.
    six = [torch.full((32,), 1e6)] * 6
    captured = rule([*six, *g[:5]])
    assert bool((captured > 1e5).all())


def test_registries_list_and_resolve_names() -> None:
    assert list_aggregators() == [
        "average",
        "bulyan",
        "krum",
        "mda",
        "median",
        "multi_krum",
        "trimmed_mean",
        "weighted_average",
    ]
    assert list_preaggregators() == ["bucketing", "clipping", "nnm"]
    assert list_attacks() == ["alie", "drop", "foe", "nonfinite", "random", "reverse"]
    assert type(get_aggregator("Multi-Krum", n=7, f=1)).__name__ == "MultiKrum"
    assert type(get_attack("fall-of-empires")).__name__ == "FallOfEmpires"
    assert type(get_attack("little_is_enough")).__name__ == "ALittleIsEnough"
    assert type(get_preaggregator("NNM", n=5, f=1)).__name__ == "NearestNeighborMixing"
    assert get_aggregator("multi_krum", n=9, f=2, m=3).m == 3  # type: ignore[attr-defined]


def test_registry_errors_are_clear() -> None:
    with pytest.raises(UnknownNameError, match="unknown aggregator 'krumm'; known: average"):
        get_aggregator("krumm", n=7, f=1)
    with pytest.raises(UnknownNameError):
        get_attack("nope")
    with pytest.raises(UnknownNameError):
        get_preaggregator("nope", n=3)
    with pytest.raises(InvalidParameterError, match="accepted"):
        get_aggregator("median", n=7, f=1, m=3)
    with pytest.raises(LookupError):  # UnknownNameError is also a LookupError
        get_attack("nope")
