"""Pre-aggregation steps that run in front of any rule, and :class:`Chain` to combine them.

A step maps n vectors to n' vectors (n' = n except for bucketing); ``Chain(step..., rule)``
checks at construction that each step's output count is the next one's ``n``. None of these
steps is in the sources (docs/references.md); they follow ByzFL's pre-aggregators (``byzfl.aggregators.preaggregators``)
and their papers:

- :class:`NearestNeighborMixing` (NNM; Allouah et al., AISTATS 2023): each x_i becomes the mean
  of its n - f nearest vectors (itself included). Same definition as ByzFL ``NNM(f)``.
- :class:`Bucketing` (Karimireddy, He and Jaggi, ICLR 2022): shuffle, split into ceil(n/s)
  buckets of s vectors (the last one may be smaller), average each bucket. Same as ByzFL
  ``Bucketing(s)`` except that the permutation comes from this object's seeded generator.
- :class:`Clipping` (static l2 clipping): ``x_i * min(1, c / ||x_i||)``. Same as ByzFL
  ``Clipping(c)``, except that it does not modify its input in place.

Non-finite inputs pass through NNM and clipping unchanged (and a bucket holding one becomes
non-finite), so the rule at the end of the chain still sees them as non-finite and excludes
them; NNM never mixes a non-finite vector into a finite one while at most f are non-finite.
"""

from __future__ import annotations

import abc
import math

import torch
from torch import Tensor

from ._distances import distances_and_finite
from ._tensors import (
    Inputs,
    Matrix,
    as_matrix,
    check_inputs,
    host_decides,
    stack_checked,
    to_device,
)
from .aggregators import Aggregator, check_count
from .errors import InvalidParameterError, RequirementError
from .names import PREAGGREGATORS, Registered

__all__ = ["Bucketing", "Chain", "Clipping", "NearestNeighborMixing", "PreAggregator"]


class PreAggregator(Registered, abc.ABC):
    """Base of the pre-aggregation steps: ``[n, *shape] -> [n', *shape]``.

    Every step takes ``n`` and ``f`` so the registry can build any of them the same way; the
    ones that do not use ``f`` ignore it.
    """

    registry = PREAGGREGATORS

    def __init__(self, n: int, f: int = 0) -> None:
        self.n = check_count("n", n, 1)
        self.f = check_count("f", f, 0)

    @property
    def output_count(self) -> int:
        """How many vectors this step outputs for its ``n`` inputs."""
        return self.n

    @torch.no_grad()
    def __call__(self, inputs: Inputs) -> Tensor:
        """Transform ``n`` inputs; returns one stacked tensor ``[output_count, *shape]``."""
        matrix = as_matrix(inputs, self.n)
        return matrix.restore_stack(self._transform_matrix(matrix))

    def _transform_matrix(self, matrix: Matrix) -> Tensor:
        return self._transform(matrix.data)

    @abc.abstractmethod
    def _transform(self, data: Tensor) -> Tensor:
        """``[n, d] -> [output_count, d]``; must not return a view of ``data``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, f={self.f})"


class NearestNeighborMixing(PreAggregator, name="nnm", aliases=("nearest_neighbor_mixing",)):
    """NNM: replace each x_i by the mean of its n - f nearest vectors, itself included.

    ``y_i = (1/(n-f)) sum_{j in N_i} x_j`` with N_i the n - f indices closest to x_i in l2
    (Allouah et al., "Fixing by Mixing", AISTATS 2023). Requires f < n; cost O(n^2 d).
    Implemented as one ``[n, n] @ [n, d]`` product with the 0/1 neighbour matrix.
    Non-finite rows are left as they are; a finite row whose n - f neighbours cannot all be
    finite (more than f non-finite inputs) becomes NaN rather than a silently biased mean.
    """

    def __init__(self, n: int, f: int = 0) -> None:
        super().__init__(n, f)
        if f >= n:
            raise RequirementError(f"{self.name}: requires f < n (n={n}, f={f})")

    def _transform(self, data: Tensor) -> Tensor:
        k = self.n - self.f
        dist, finite = distances_and_finite(data)
        # A stable sort, not topk: of equidistant neighbours the lower index is taken, on every CPU.
        neighbours = torch.argsort(dist, dim=1, stable=True)[:, :k]
        weights = torch.zeros(self.n, self.n, dtype=data.dtype, device=data.device)
        weights.scatter_(1, neighbours, 1.0 / k)
        if host_decides(data) and bool(finite.all()):
            return weights @ data
        # Masks, not boolean indexing, so that on a GPU nothing is read back to the host.
        bad = ~finite
        mixed = weights @ data.masked_fill(bad.unsqueeze(1), 0.0)
        tainted = ((weights > 0) & bad.unsqueeze(0)).any(dim=1)
        mixed.masked_fill_(tainted.unsqueeze(1), float("nan"))
        return torch.where(finite.unsqueeze(1), mixed, data)


class Bucketing(PreAggregator, name="bucketing"):
    """Bucketing: random permutation, then the mean of each bucket of ``s`` vectors.

    Outputs ceil(n/s) vectors; the last bucket holds the n mod s leftovers when s does not
    divide n (Karimireddy et al., ICLR 2022; ByzFL ``Bucketing``). The rule after it is built
    for n' = ceil(n/s) inputs with the same f: f Byzantine inputs taint at most f buckets.
    ``seed`` fixes the sequence of permutations (one per call); None draws a fresh seed.
    A bucket with a non-finite input is non-finite. Cost O(nd).
    """

    def __init__(self, n: int, f: int = 0, *, s: int = 2, seed: int | None = None) -> None:
        super().__init__(n, f)
        self.s = check_count("s", s, 1)
        self.seed = seed
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    @property
    def output_count(self) -> int:
        return math.ceil(self.n / self.s)

    @torch.no_grad()
    def __call__(self, inputs: Inputs) -> Tensor:
        """Shuffle ``n`` inputs into buckets; returns the ``[output_count, *shape]`` means."""
        if isinstance(inputs, Tensor):
            return super().__call__(inputs)
        # A list is stacked in the permuted order: no second copy to shuffle the stack, and on
        # a GPU no permutation to copy to the device.
        items = check_inputs(inputs, self.n)
        order = self._permutation().tolist()
        matrix = stack_checked([items[i] for i in order])
        return matrix.restore_stack(self._bucket_means(matrix.data))

    def _permutation(self) -> Tensor:
        # Drawn on the CPU so a seed gives the same buckets on every device.
        return torch.randperm(self.n, generator=self._generator)

    def _transform(self, data: Tensor) -> Tensor:
        shuffled = data.index_select(0, to_device(self._permutation(), data.device))
        return self._bucket_means(shuffled)

    def _bucket_means(self, shuffled: Tensor) -> Tensor:
        """Means of consecutive groups of ``s`` rows (the last group may be shorter)."""
        full, rest = divmod(self.n, self.s)
        out = torch.empty(
            self.output_count, shuffled.shape[1], dtype=shuffled.dtype, device=shuffled.device
        )
        torch.mean(shuffled[: full * self.s].view(full, self.s, -1), dim=1, out=out[:full])
        if rest:
            torch.mean(shuffled[full * self.s :], dim=0, out=out[full])
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, s={self.s}, seed={self.seed})"


class Clipping(PreAggregator, name="clipping", aliases=("clip",)):
    """Static l2 clipping: ``y_i = x_i * min(1, c / ||x_i||)``.

    Bounds the influence of any single vector to norm ``c`` (default 2.0, ByzFL's default).
    A norm that overflows the working dtype is computed again in float64, so a large but
    finite vector is clipped rather than zeroed. Non-finite rows are passed through unchanged.
    Cost O(nd).
    """

    def __init__(self, n: int, f: int = 0, *, c: float = 2.0) -> None:
        super().__init__(n, f)
        if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c <= 0:
            raise InvalidParameterError(f"{self.name}: c must be a finite number > 0, got {c!r}")
        self.c = float(c)

    def _transform_matrix(self, matrix: Matrix) -> Tensor:
        # A stack made from a list belongs to this call: scale it in place, as ByzFL does with
        # its own stack, instead of allocating and filling a second [n, d] tensor.
        scale = self._scale(matrix.data)
        if matrix.owned:
            return matrix.data.mul_(scale)
        return matrix.data * scale

    def _transform(self, data: Tensor) -> Tensor:
        return data * self._scale(data)

    def _scale(self, data: Tensor) -> Tensor:
        """``[n, 1]`` factors ``min(1, c / ||x_i||)``, 1 for non-finite rows."""
        norms = torch.linalg.vector_norm(data, dim=1).double()
        overflowed = ~torch.isfinite(norms)
        if bool(overflowed.any()):
            # Inf here is either a non-finite row or a finite one whose norm overflowed.
            norms[overflowed] = torch.linalg.vector_norm(
                data[overflowed], dim=1, dtype=torch.float64
            )
        scale = torch.clamp(self.c / norms, max=1.0)
        scale = torch.where(torch.isfinite(norms), scale, torch.ones_like(scale))
        return scale.to(data.dtype).unsqueeze(1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, c={self.c})"


class Chain:
    """``Chain(step_1, ..., step_k, rule)``: run pre-aggregation steps, then a rule.

    Checked at construction: every step's ``output_count`` equals the next step's (or the
    rule's) ``n``. ``n`` is the first step's input count and ``f`` the rule's declared f.
    """

    def __init__(self, *steps: PreAggregator | Aggregator) -> None:
        if not steps or not isinstance(steps[-1], Aggregator):
            raise InvalidParameterError("Chain needs an aggregation rule as its last step")
        rule = steps[-1]
        pre: list[PreAggregator] = []
        for step in steps[:-1]:
            if not isinstance(step, PreAggregator):
                raise InvalidParameterError(
                    f"Chain: {step!r} is not a pre-aggregation step; only the last step may "
                    "be an aggregation rule"
                )
            pre.append(step)
        following: list[PreAggregator | Aggregator] = [*pre[1:], rule]
        for current, nxt in zip(pre, following, strict=True):
            if current.output_count != nxt.n:
                raise RequirementError(
                    f"Chain: {current!r} outputs {current.output_count} vectors but "
                    f"{nxt!r} expects n={nxt.n}"
                )
        self.pre = tuple(pre)
        self.rule = rule
        self.n = pre[0].n if pre else rule.n
        self.f = rule.f

    def __call__(self, inputs: Inputs) -> Tensor:
        """Apply the steps in order, then the rule; returns one tensor of the element shape."""
        current: Inputs = inputs
        for step in self.pre:
            current = step(current)
        return self.rule(current)

    def __repr__(self) -> str:
        return f"Chain({', '.join(repr(s) for s in (*self.pre, self.rule))})"
