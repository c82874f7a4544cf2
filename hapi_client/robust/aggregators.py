"""Gradient aggregation rules (GARs) as small callables.

A rule is built once with ``n`` (how many vectors it aggregates per call) and ``f`` (the declared
maximum number of Byzantine inputs among them) and validated then: each rule checks its
resilience requirement (Krum n >= 2f+3, Bulyan n >= 4f+3, ...) and raises
:class:`~hapi_client.robust.errors.RequirementError` otherwise, as Garfield's ``init(name, n, f)``
does (thesis §3.3.2). Each call validates again: exactly ``n`` inputs, one shape, one device, one
floating dtype. The inputs are a list of tensors or one stacked tensor ``[n, ...]``; any element
shape is flattened to ``d`` coordinates. The result is a new tensor (never a view of an input)
with the element shape, dtype and device of the inputs. Everything is computed with vectorised
torch ops on the inputs' device, in at least float32, under ``torch.no_grad()``.

Sources (see docs/references.md): the thesis, §3.3.1 (Garfield's rules), and the Garfield paper,
§3.1. Readings where the sources are ambiguous (labels of docs/references.md):

- R5: the median of an even count is the mean of the two middle values.
- R6: Bulyan uses Krum as its inner rule, theta = n - 2f selections, beta = n - 4f.
- R7: Krum scores use *squared* distances (thesis eq. (3.7)), not the prose's "sum of l2
  distances" (§3.3.1 item 2).
- R8: Multi-Krum averages m = n - f - 2 vectors by default (thesis §3.3.1 item 2).
- R9: the trimmed mean is in none of the sources; it is here as a common addition.

Non-finite inputs (NaN, +-Inf). Robust rules return a finite result whenever at most ``f`` inputs
are non-finite (and the honest ones are finite and do not overflow):

- distance-based rules (Krum, Multi-Krum, MDA, Bulyan's selection) treat a vector with any
  non-finite coordinate as infinitely far from every other vector and rank it after every
  finite vector, so it is never selected while enough finite vectors exist;
- coordinate-wise rules (median, trimmed mean, Bulyan's second phase) order NaN as +inf per
  coordinate, so at most ``f`` extreme values per coordinate are never the median and are
  trimmed away;
- the non-robust averages raise :class:`~hapi_client.robust.errors.NonFiniteInputError` naming
  the offending inputs (``nonfinite="raise"``, the default) or return the plain, non-finite mean
  (``nonfinite="propagate"``, e.g. to show a baseline failing in a benchmark).

On a GPU a call only queues kernels, as ByzFL's rules do: the rules decide on the device
(masks, ``torch.where``) and read nothing back to the host, which would wait for every queued
kernel (see ``_tensors.HOST_DEVICE_TYPES``; on the CPU they read freely, as reads cost nothing
there, and skip work they do not need). The exceptions: the averages with
``nonfinite="raise"`` read one value per call (raising needs the answer on the host), clipping
reads one (does any norm need redoing in float64; ByzFL's clipping reads every norm), and the
``select`` diagnostics return Python lists.

Differences from ByzFL 0.0.11 (``byzfl.aggregators``), which the tests use as an oracle:

- ByzFL's Krum/MultiKrum score a vector by the *mean* of its n - f - 1 nearest squared
  distances and Multi-Krum averages n - f vectors; here the score is the *sum* over the
  n - f - 2 nearest (Krum's paper; thesis §3.3.1, eq. (3.7)) and m = n - f - 2. ByzFL ``Krum(f + 1)``
  therefore selects the same vector as ``Krum(n, f)``, and ByzFL ``MultiKrum(f + 1)`` equals
  ``MultiKrum(n, f, m=n - f - 1)``.
- ByzFL's rules only require 2f < n; here each rule checks its own requirement from the thesis (§3.3.1).
- ByzFL's torch median is ``torch.quantile`` (a sort of all n values per coordinate); here
  the middle values come from :func:`~hapi_client.robust._order.sorted_rows` (a comparator
  network of row-wise min/max on the CPU, a sort on a GPU; same values, and R5 for even n, as
  ``quantile`` agrees).
- ByzFL has no Bulyan and no batch-weighted average; its rules return NaN on NaN inputs.
"""

from __future__ import annotations

import abc
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import ClassVar, Literal

import torch
from torch import Tensor

from ._distances import distances_and_finite, rank_rows
from ._order import median_rows, sorted_rows
from ._tensors import (
    Inputs,
    all_finite,
    as_matrix,
    check_inputs,
    finite_rows,
    host_decides,
    stack_checked,
    to_device,
    work_dtype,
)
from .errors import (
    ComplexityLimitError,
    InputMismatchError,
    InvalidParameterError,
    NonFiniteInputError,
    RequirementError,
)
from .names import AGGREGATORS, Registered

__all__ = [
    "MDA",
    "Aggregator",
    "Average",
    "BatchWeightedAverage",
    "Bulyan",
    "Krum",
    "Median",
    "MultiKrum",
    "NonFinitePolicy",
    "TrimmedMean",
]

#: What the non-robust averages do with NaN/Inf inputs.
NonFinitePolicy = Literal["raise", "propagate"]


def check_count(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an int >= ``minimum``; raise InvalidParameterError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameterError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidParameterError(f"{name} must be >= {minimum}, got {value}")
    return value


class Aggregator(Registered, abc.ABC):
    """Base of every aggregation rule: ``rule = Rule(n, f); out = rule(inputs)``.

    Subclasses name themselves at the class statement (``class X(Aggregator, name="x")``, see
    :class:`~.names.Registered`), set :attr:`requirement` (human-readable) and :meth:`min_n`,
    and implement :meth:`_aggregate` on the flattened ``[n, d]`` matrix.
    """

    registry = AGGREGATORS
    requirement: ClassVar[str] = "n >= f + 1"

    def __init__(self, n: int, f: int = 0) -> None:
        self.n = check_count("n", n, 1)
        self.f = check_count("f", f, 0)
        problem = self.check(n, f)
        if problem is not None:
            raise RequirementError(f"{self.name}: {problem}")

    @classmethod
    def min_n(cls, f: int) -> int:
        """Smallest n this rule accepts for ``f`` declared Byzantine inputs."""
        return f + 1

    @classmethod
    def max_f(cls, n: int) -> int:
        """Largest f this rule accepts with ``n`` inputs (-1 if even f = 0 is refused)."""
        f = -1
        while cls.min_n(f + 1) <= n:
            f += 1
        return f

    @classmethod
    def check(cls, n: int, f: int) -> str | None:
        """Return why (n, f) is refused, or None if the rule accepts it (Garfield's ``check``)."""
        if n < cls.min_n(f):
            return f"requires {cls.requirement} (n={n}, f={f} needs n >= {cls.min_n(f)})"
        return None

    @torch.no_grad()
    def __call__(self, inputs: Inputs) -> Tensor:
        """Aggregate ``n`` tensors (a list, or one tensor stacked on dim 0) into one."""
        matrix = as_matrix(inputs, self.n)
        return matrix.restore(self._aggregate(matrix.data))

    @abc.abstractmethod
    def _aggregate(self, data: Tensor) -> Tensor:
        """``[n, d] -> [d]``; must not return a view of ``data``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, f={self.f})"


def _refuse_nonfinite(name: str, data: Tensor, result: Tensor) -> None:
    """Raise if an input holding NaN/Inf made ``result`` (a weighted mean of the rows) non-finite.

    NaN and Inf reach every weighted mean (``0 * inf`` is NaN), so a finite result proves finite
    inputs and this costs a pass over the ``[d]`` result only. The inputs are searched only when
    the result is not finite, to name the culprits, or to find none when finite inputs overflowed.
    """
    if all_finite(result):
        return
    finite = finite_rows(data)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).squeeze(1).tolist()
        raise NonFiniteInputError(
            f"{name}: inputs {bad} contain NaN/Inf; the average is not robust to them. Use a "
            "robust rule, drop those inputs, or pass nonfinite='propagate' to get a "
            "non-finite result"
        )


def _check_policy(policy: str) -> NonFinitePolicy:
    if policy == "raise":
        return "raise"
    if policy == "propagate":
        return "propagate"
    raise InvalidParameterError(f"nonfinite must be 'raise' or 'propagate', got {policy!r}")


class Average(Aggregator, name="average", aliases=("mean",)):
    """Arithmetic mean, the non-robust baseline: ``(1/n) sum_i x_i`` (thesis §3.6.3).

    Tolerates no Byzantine input; ``f`` is accepted (f < n) so it can sit in the same tables as
    the robust rules. Cost O(nd). Non-finite inputs: see ``nonfinite`` (default: raise).
    """

    def __init__(self, n: int, f: int = 0, *, nonfinite: NonFinitePolicy = "raise") -> None:
        super().__init__(n, f)
        self.nonfinite = _check_policy(nonfinite)

    @torch.no_grad()
    def __call__(self, inputs: Inputs) -> Tensor:
        """Average ``n`` tensors (a list, or one tensor stacked on dim 0)."""
        if isinstance(inputs, Tensor):
            return super().__call__(inputs)
        items = check_inputs(inputs, self.n)
        if not host_decides(items[0]):
            # On a GPU one stack and one mean (two kernels, as ByzFL) beat n launches.
            matrix = stack_checked(items)
            return matrix.restore(self._aggregate(matrix.data))
        # On the CPU adding the list into one buffer reads each input once, where stacking
        # writes and reads all of them again: 2-3x faster at d = 1e5..1e6. The rows are added in
        # input order, then divided, as ``torch.stack(items).mean(0)`` does (bit for bit at those
        # sizes; for short rows torch may group the additions differently, within rounding).
        total = items[0].to(work_dtype(items[0].dtype), copy=True)
        for item in items[1:]:
            total.add_(item)
        mean = total.div_(self.n)
        if self.nonfinite == "raise" and not all_finite(mean):
            _refuse_nonfinite(self.name, torch.stack(items).reshape(self.n, -1), mean)
        return mean.to(items[0].dtype)

    def _aggregate(self, data: Tensor) -> Tensor:
        mean = data.mean(dim=0)
        if self.nonfinite == "raise":
            _refuse_nonfinite(self.name, data, mean)
        return mean


class BatchWeightedAverage(
    Aggregator, name="weighted_average", aliases=("batch_weighted_average",)
):
    """Average weighted by each worker's batch size (LB-BSP §3.4, eq. (7)).

    ``g = (1 / sum_j |B_j|) * sum_i |B_i| g_i``: every sample weighs 1/X, so workers with
    unequal batches (see :class:`~hapi_client.robust.BatchBalancer`) keep BSP's statistical
    efficiency. Not robust: a Byzantine worker could claim a huge batch, which is why the robust
    rules ignore self-reported batch sizes (a design decision; no source combines them).

    ``batch_sizes`` may be given at construction (fixed) or per call (they change as the
    balancer moves samples); the per-call value wins. Non-finite inputs: as :class:`Average`.
    """

    def __init__(
        self,
        n: int,
        f: int = 0,
        *,
        batch_sizes: Sequence[float] | Tensor | None = None,
        nonfinite: NonFinitePolicy = "raise",
    ) -> None:
        super().__init__(n, f)
        self.nonfinite = _check_policy(nonfinite)
        self.batch_sizes = None if batch_sizes is None else self._weights(batch_sizes)

    def _weights(self, batch_sizes: Sequence[float] | Tensor) -> Tensor:
        weights = torch.as_tensor(batch_sizes, dtype=torch.float64).flatten().cpu()
        if weights.numel() != self.n:
            raise InputMismatchError(
                f"{self.name}: expected {self.n} batch sizes, got {weights.numel()}"
            )
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise InputMismatchError(f"{self.name}: batch sizes must be finite and >= 0")
        if float(weights.sum()) <= 0:
            raise InputMismatchError(f"{self.name}: batch sizes sum to 0")
        return weights

    @torch.no_grad()
    def __call__(
        self, inputs: Inputs, batch_sizes: Sequence[float] | Tensor | None = None
    ) -> Tensor:
        """Aggregate ``inputs`` with ``batch_sizes`` (or those given at construction)."""
        weights = self._weights(batch_sizes) if batch_sizes is not None else self.batch_sizes
        matrix = as_matrix(inputs, self.n)
        return matrix.restore(self._weighted(matrix.data, weights))

    def _weighted(self, data: Tensor, weights: Tensor | None) -> Tensor:
        if weights is None:
            mean = data.mean(dim=0)
        else:
            w = to_device(weights / weights.sum(), data.device).to(dtype=data.dtype)
            mean = w @ data
        if self.nonfinite == "raise":
            _refuse_nonfinite(self.name, data, mean)
        return mean

    def _aggregate(self, data: Tensor) -> Tensor:
        return self._weighted(data, self.batch_sizes)


class Median(Aggregator, name="median"):
    """Coordinate-wise median (thesis §3.3.1, eqs. (3.1)-(3.6)): ``out[j] = median(x_1[j], ..., x_n[j])``.

    Odd n: the ceil(n/2)-th sorted value (eq. (3.3)); even n: the mean of the two middle values
    (R5). Requires n >= 2f+1; cost O(nd log^2 n) (a pruned sorting network on the CPU, see
    :func:`~hapi_client.robust._order.sorted_rows`).
    Non-finite values: NaN is ordered as +inf, so with at most f non-finite values per
    coordinate the median is one of (or between two of) the finite ones.
    """

    requirement = "n >= 2f+1"

    @classmethod
    def min_n(cls, f: int) -> int:
        return 2 * f + 1

    def _aggregate(self, data: Tensor) -> Tensor:
        return median_rows(data)


class TrimmedMean(Aggregator, name="trimmed_mean", aliases=("trmean",)):
    """Coordinate-wise trimmed mean (in none of the sources, R9; Yin et al., ICML 2018).

    Per coordinate, sort the n values, drop the f smallest and the f largest and average the
    n - 2f left: ``out[j] = (1/(n-2f)) sum_{k=f+1}^{n-f} x_(k)[j]``. Requires n >= 2f+1;
    cost O(nd log^2 n) on the CPU (a sorting network), O(nd log n) on a GPU. Non-finite values: NaN is ordered as +inf, so at most f non-finite values
    per coordinate are always trimmed when they sit at one end (and at most f per end in general).
    """

    requirement = "n >= 2f+1"

    @classmethod
    def min_n(cls, f: int) -> int:
        return 2 * f + 1

    def _aggregate(self, data: Tensor) -> Tensor:
        if self.f == 0:
            return data.mean(dim=0)
        # sorted_rows reads NaN as +inf: more than f non-finite values at the top of a
        # coordinate make its mean +inf (NaN if the kept values also hold -inf).
        return sorted_rows(data, self.f, self.n - self.f).mean(dim=0)


def _krum_scores(dist: Tensor, neighbours: int) -> Tensor:
    """Sum of each row's ``neighbours`` smallest squared distances to *other* rows (Eq. 3.7)."""
    if neighbours <= 0:
        return torch.zeros(dist.shape[0], dtype=dist.dtype, device=dist.device)
    others = dist.clone()
    others.fill_diagonal_(float("inf"))
    return torch.topk(others, neighbours, dim=1, largest=False).values.sum(dim=1)


class MultiKrum(Aggregator, name="multi_krum", aliases=("multikrum",)):
    """Multi-Krum (thesis §3.3.1, eqs. (3.7)-(3.8)): average of the m vectors with the smallest Krum scores.

    ``s(i) = sum_{i -> j} ||x_i - x_j||^2`` over the n - f - 2 vectors closest to x_i (squared
    distances, eq. (3.7); R7), ``S = (m) argmin_i s(i)`` (eq. (3.8)), output ``(1/m) sum_{i in S}
    x_i``. Default m = n - f - 2 (R8); m = 1 is Krum. Requires n >= 2f+3; cost O(n^2 d).
    Ties go to the lower input index. Non-finite inputs are infinitely far from everything and
    ranked last, so they are never among the m chosen while n - f >= m finite inputs exist.
    """

    requirement = "n >= 2f+3"

    def __init__(self, n: int, f: int = 0, *, m: int | None = None) -> None:
        super().__init__(n, f)
        self.m = n - f - 2 if m is None else check_count("m", m, 1)
        if self.m > n:
            raise InvalidParameterError(f"{self.name}: m={self.m} exceeds n={n}")

    @classmethod
    def min_n(cls, f: int) -> int:
        return 2 * f + 3

    def select(self, inputs: Inputs) -> list[int]:
        """Indices of the selected inputs, best first (for tests and diagnostics)."""
        matrix = as_matrix(inputs, self.n)
        return self._select(matrix.data).tolist()

    def _select(self, data: Tensor) -> Tensor:
        dist, finite = distances_and_finite(data)
        scores = _krum_scores(dist, self.n - self.f - 2)
        return rank_rows(scores, (~finite).to(torch.int8))[: self.m]

    def _aggregate(self, data: Tensor) -> Tensor:
        chosen = self._select(data)
        # Advanced indexing copies, so even m = 1 does not alias the caller's tensor.
        return data[chosen].mean(dim=0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, f={self.f}, m={self.m})"


class Krum(MultiKrum, name="krum"):
    """Krum (thesis §3.3.1, eqs. (3.7)-(3.8)): the single vector with the smallest score (Multi-Krum with m = 1).

    Requires n >= 2f+3; cost O(n^2 d). Returns a copy of the selected input.
    """

    def __init__(self, n: int, f: int = 0) -> None:
        super().__init__(n, f, m=1)


def _chunks(combos: Iterator[tuple[int, ...]], size: int) -> Iterator[list[tuple[int, ...]]]:
    while chunk := list(itertools.islice(combos, size)):
        yield chunk


class MDA(Aggregator, name="mda", aliases=("minimum_diameter_averaging",)):
    """Minimum-diameter averaging (thesis §3.3.1, eqs. (3.9)-(3.10)): average of the tightest subset of n - f inputs.

    ``S = argmin_{M subset of X, |M| = n-f} max_{x_i, x_j in M} ||x_i - x_j||`` (eq. (3.9)), output
    ``(1/(n-f)) sum_{x in S} x`` (eq. (3.10)). Requires n >= 2f+1. Exhaustive search: cost
    O(C(n, f) (n-f)^2 + n^2 d) -- exponential when f grows with n (§3.3.1, footnote 1) -- so the rule refuses
    at construction (``ComplexityLimitError``) when C(n, f) exceeds ``max_subsets``
    (default 1,000,000, about a second on a CPU). Ties go to the first subset in lexicographic
    order. A subset holding a non-finite input has infinite diameter and loses to every finite
    subset.
    """

    requirement = "n >= 2f+1"
    #: Subsets evaluated per vectorised step; bounds memory to chunk * (n-f)^2 distances.
    chunk_size: ClassVar[int] = 4096

    def __init__(self, n: int, f: int = 0, *, max_subsets: int = 1_000_000) -> None:
        super().__init__(n, f)
        self.max_subsets = check_count("max_subsets", max_subsets, 1)
        self.subsets = math.comb(n, f)
        if self.subsets > self.max_subsets:
            raise ComplexityLimitError(
                f"{self.name}: n={n}, f={f} means C({n}, {f}) = {self.subsets:,} subsets to "
                f"search, above max_subsets={self.max_subsets:,}; use Krum/Bulyan/median, "
                "a smaller f, or raise max_subsets"
            )

    @classmethod
    def min_n(cls, f: int) -> int:
        return 2 * f + 1

    def select(self, inputs: Inputs) -> list[int]:
        """Indices of the chosen subset (for tests and diagnostics)."""
        matrix = as_matrix(inputs, self.n)
        return self._select(matrix.data).tolist()

    def _select(self, data: Tensor) -> Tensor:
        size = self.n - self.f
        dist = distances_and_finite(data)[0]
        # Each chunk's best subset and diameter stay on the device; argmin returns the first
        # minimum, so the first subset in lexicographic order wins ties, and the very first
        # subset when every subset holds a non-finite input (all diameters +inf).
        values: list[Tensor] = []
        subsets: list[Tensor] = []
        combos = itertools.combinations(range(self.n), size)
        for chunk in _chunks(combos, self.chunk_size):
            idx = to_device(torch.tensor(chunk, dtype=torch.long), dist.device)
            diameters = dist[idx.unsqueeze(2), idx.unsqueeze(1)].flatten(1).amax(dim=1)
            j = torch.argmin(diameters).reshape(1)
            values.append(diameters.index_select(0, j))
            subsets.append(idx.index_select(0, j))
        best = torch.argmin(torch.cat(values)).reshape(1)
        return torch.cat(subsets).index_select(0, best)[0]

    def _aggregate(self, data: Tensor) -> Tensor:
        return data[self._select(data)].mean(dim=0)


class Bulyan(Aggregator, name="bulyan"):
    """Bulyan with Krum inside (thesis §3.3.1, Algorithm 1; El Mhamdi et al., ICML 2018).

    1. Selection: theta = n - 2f times, run Krum on the inputs not yet selected and move the
       winner to the selection set (R6: the thesis' ``theta = n - 2f`` with Krum as the inner
       GAR). Pairwise distances are computed once and reused (as Garfield caches them,
       thesis §3.4.4). Krum on r remaining inputs sums r - f - 2 neighbours; the last two rounds
       would have 0 or fewer, so at least 1 neighbour is used (the closest pair wins).
    2. Per coordinate j: M[j] = median of the theta selected values (R5 for even theta); output
       the average of the beta = n - 4f selected values closest to M[j].

    Ties break by input index everywhere: the distance matrix is exactly symmetric, so the two
    candidates of a last Krum round have equal scores and the lower index wins; in phase 2, of
    two values equally far from the median the one of the lower input index is kept.

    Requires n >= 4f+3; cost O(n^2 d) for the distances plus O(theta d) per phase-2 step.
    Non-finite inputs rank last in every Krum round; with at most f of them all theta
    selections are finite, since n - f >= theta.
    """

    requirement = "n >= 4f+3"

    @classmethod
    def min_n(cls, f: int) -> int:
        return 4 * f + 3

    def select(self, inputs: Inputs) -> list[int]:
        """Indices selected by the Krum phase, in selection order."""
        matrix = as_matrix(inputs, self.n)
        return self._select(matrix.data)[0].tolist()

    def _select(self, data: Tensor) -> tuple[Tensor, bool]:
        """The Krum phase's picks, and True if every pick is known to be finite."""
        n, f = self.n, self.f
        theta = n - 2 * f
        dist, finite = distances_and_finite(data)
        alive = torch.ones(n, dtype=torch.bool, device=data.device)
        base_penalty = (~finite).to(torch.int8)
        picks: list[Tensor] = []
        for remaining in range(n, n - theta, -1):
            neighbours = min(max(remaining - f - 2, 1), remaining - 1)
            masked = dist.masked_fill(~alive.unsqueeze(0), float("inf"))
            scores = _krum_scores(masked, neighbours)
            penalty = base_penalty + 2 * (~alive).to(torch.int8)
            best = rank_rows(scores, penalty)[:1]  # kept on the device: no host read per round
            picks.append(best)
            alive.index_fill_(0, best, False)
        chosen = torch.cat(picks)
        # On a GPU phase 2 assumes a non-finite pick rather than read the answer back.
        return chosen, host_decides(data) and bool(finite[chosen].all())

    def _aggregate(self, data: Tensor) -> Tensor:
        # Phase 2 depends only on the selected set: in input order, a stable sort gives two
        # values equally far from the median (c - e and c + e) to the lower input index, where
        # topk's choice would be unspecified and change the output.
        chosen, picks_finite = self._select(data)
        selected = data[chosen.sort().values]
        beta = self.n - 4 * self.f
        if beta == selected.shape[0]:
            return selected.mean(dim=0)
        centre = median_rows(selected)
        deviation = (selected - centre).abs()
        if not picks_finite:  # finite picks give finite deviations (or +inf on overflow), no NaN
            deviation = torch.nan_to_num(deviation, nan=float("inf"))
        closest = torch.sort(deviation, dim=0, stable=True).indices[:beta]
        return selected.gather(0, closest).mean(dim=0)
