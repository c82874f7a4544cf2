"""The device-side paths (taken on a GPU, where host reads stall) give the CPU paths' results.

On the CPU the rules branch on values read back to Python (is every row finite? is the first
centring good enough?); on a GPU they decide with masks and ``torch.where`` instead. Setting
``HOST_DEVICE_TYPES`` to ``frozenset()`` runs those device-side paths on the CPU, so their
results can be compared bit for bit with the host paths on any machine; the GPU test checks that
they really read nothing back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from hapi_client.robust import (
    MDA,
    Average,
    NonFiniteInputError,
    _tensors,
    aggregator_class,
    get_aggregator,
    get_preaggregator,
    list_aggregators,
    list_preaggregators,
)
from hapi_client.robust._distances import distances_and_finite

N = 11


def _cases() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    honest = 1.0 + 0.1 * torch.randn(N, 40, generator=gen)
    cases = {"clean": honest.clone()}
    outlier = 1000.0 + 0.01 * torch.randn(N, 40, generator=gen)
    outlier[0] = 1e6  # the first centring is far off: the rules centre again
    cases["outlier_first"] = outlier
    poisoned = honest.clone()
    poisoned[0] = float("nan")
    poisoned[3] = float("inf")
    poisoned[7, 5] = float("-inf")
    cases["nonfinite"] = poisoned
    overflow = honest.clone()
    overflow[2] = 3e38  # finite, but its squared distances overflow
    overflow[9] = -3e38
    cases["overflow"] = overflow
    swamped = honest.clone()
    swamped[: N - 2] = float("nan")  # more than any f: NaN reaches the middle of the order
    swamped[4, ::2] = float("-inf")
    cases["mostly_nonfinite"] = swamped
    ties = torch.zeros(N, 40)
    ties[::2] = 1.0
    cases["ties"] = ties
    return cases


CASES = _cases()


@pytest.fixture
def on_device(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[Callable[[], object]], object]]:
    """Run a callable with the device-side paths forced on the CPU."""

    def run(fn: Callable[[], object]) -> object:
        with monkeypatch.context() as patch:
            patch.setattr(_tensors, "HOST_DEVICE_TYPES", frozenset())
            return fn()

    yield run


def _outcome(fn: Callable[[], torch.Tensor]) -> torch.Tensor | type[Exception]:
    try:
        return fn()
    except NonFiniteInputError as exc:
        return type(exc)


def _assert_same(host: object, device: object) -> None:
    if isinstance(host, torch.Tensor):
        assert isinstance(device, torch.Tensor)
        torch.testing.assert_close(device, host, rtol=0, atol=0, equal_nan=True)
    else:
        assert device == host


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("given", [False, True])
def test_distances_match(case: str, given: bool, on_device: Callable) -> None:
    x = CASES[case]
    finite = torch.isfinite(x).all(dim=1) if given else None
    dist, fin = distances_and_finite(x, finite)
    dist_d, fin_d = on_device(lambda: distances_and_finite(x, finite))
    assert torch.equal(fin_d, fin)
    assert torch.equal(dist_d, dist)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(list_aggregators()))
def test_rules_match(name: str, case: str, on_device: Callable) -> None:
    x = CASES[case]
    f = aggregator_class(name).max_f(N)
    host = _outcome(lambda: get_aggregator(name, n=N, f=f)(x))
    device = on_device(lambda: _outcome(lambda: get_aggregator(name, n=N, f=f)(x)))
    _assert_same(host, device)
    # The list path (summed in place for the average) gives the stacked path's result, up to
    # the order torch groups the additions of a mean in: each sum of N values is then within
    # (N - 1) * eps * sum |x| of the exact one (the overflow case cancels +-3e38 rows).
    listed = _outcome(lambda: get_aggregator(name, n=N, f=f)(list(x)))
    if name == "average" and isinstance(host, torch.Tensor):
        assert isinstance(listed, torch.Tensor)
        bound = 2 * torch.finfo(x.dtype).eps * x.abs().sum(dim=0)
        assert bool(((listed - host).abs() <= bound).all())
    else:
        _assert_same(host, listed)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(list_preaggregators()))
def test_preaggregation_steps_match(name: str, case: str, on_device: Callable) -> None:
    x = CASES[case]
    params = {"seed": 3} if name == "bucketing" else {}
    host = get_preaggregator(name, n=N, f=3, **params)(x)
    device = on_device(lambda: get_preaggregator(name, n=N, f=3, **params)(x))
    _assert_same(host, device)
    # Bucketing stacks a list in the permuted order; the buckets and their bits are the same.
    _assert_same(host, get_preaggregator(name, n=N, f=3, **params)(list(x)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_average_of_a_list_is_the_mean_of_the_stack(dtype: torch.dtype) -> None:
    x = (torch.randn(17, 3, 1000, generator=torch.Generator().manual_seed(2)) * 100).to(dtype)
    out = Average(17)(list(x))
    assert out.dtype == dtype and out.shape == (3, 1000)
    work = x.to(torch.promote_types(dtype, torch.float32))
    expected = work.mean(dim=0)
    # Both sum 17 rows in the work dtype, each within 16 * eps * sum |x| of the exact sum
    # (torch may group the additions differently), then round once to the input dtype.
    bound = 2 * torch.finfo(work.dtype).eps * work.abs().sum(dim=0) / 17 * 16
    bound += torch.finfo(dtype).eps * expected.abs()
    assert bool(((out.to(work.dtype) - expected).abs() <= bound).all())


def test_average_of_a_list_names_the_nonfinite_input() -> None:
    x = list(torch.ones(5, 4))
    x[3] = torch.tensor([1.0, 1.0, float("inf"), 1.0])
    with pytest.raises(NonFiniteInputError, match=r"\[3\]"):
        Average(5)(x)


def test_mda_with_only_nonfinite_subsets_takes_the_first(on_device: Callable) -> None:
    x = torch.ones(5, 3)
    x[[1, 2, 4]] = float("nan")  # every subset of 3 holds one of them
    expected = [0, 1, 2]
    assert MDA(5, 2).select(x) == expected
    assert on_device(lambda: MDA(5, 2).select(x)) == expected


# Rules whose GPU path reads nothing back to the host. Not here: the average with
# nonfinite="raise" (raising needs the host to know; one read per call) and clipping (one read
# to redo overflowed norms in float64; ByzFL's clipping reads each norm back).
SYNC_FREE: list[tuple[str, dict[str, Any]]] = [
    ("average", {"nonfinite": "propagate"}),
    ("weighted_average", {"nonfinite": "propagate", "batch_sizes": list(range(1, N + 1))}),
    ("median", {}),
    ("trimmed_mean", {}),
    ("krum", {}),
    ("multi_krum", {}),
    ("mda", {}),
    ("bulyan", {}),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", ["clean", "outlier_first", "nonfinite"])
def test_gpu_paths_read_nothing_back(case: str) -> None:
    x = CASES[case].cuda()
    items = list(x)
    calls: list[Callable[[], object]] = []
    for name, params in SYNC_FREE:
        rule = get_aggregator(name, n=N, f=aggregator_class(name).max_f(N), **params)
        calls += [functools.partial(rule, items), functools.partial(rule, x)]
    for name in ["nnm", "bucketing"]:
        step = get_preaggregator(name, n=N, f=3)
        calls += [functools.partial(step, items), functools.partial(step, x)]
    for call in calls:
        call()  # warm-up: first calls may initialise CUDA state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
