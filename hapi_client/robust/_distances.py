"""Pairwise distances with a total order that keeps non-finite inputs last."""

from __future__ import annotations

import torch
from torch import Tensor

from ._tensors import all_finite, finite_rows, host_decides

__all__ = ["distances_and_finite", "pairwise_sq_distances", "rank_rows"]


def _centred_gram(data: Tensor, ref: int | Tensor) -> tuple[Tensor, Tensor]:
    """``||x_i - x_j||^2`` as ``|c_i|^2 + |c_j|^2 - 2 c_i.c_j`` with ``c = x - x_ref``.

    One ``[n, d] @ [d, n]`` product (BLAS) instead of n^2/2 passes over d. Centring on a row
    near the honest cluster keeps the norms of the same order as the distances, so the
    cancellation in the expansion costs little (here about 1e-5 relative in float32, better than
    ``torch.cdist``'s direct kernel at d = 1e6). On CUDA the product follows torch's float32
    matmul precision setting: with TF32 enabled (``torch.set_float32_matmul_precision("high")``)
    distances are only good to about 1e-3 relative. The result is exactly symmetric.

    ``ref`` is a row index, or a one-element index tensor on ``data``'s device (no host read).
    Also returns ``|c_i|^2``: it is finite exactly when row i and the reference row are finite
    (and the square did not overflow), which tells the callers, without a pass over the
    ``[n, d]`` inputs, that every row is finite.
    """
    centre = data[ref] if isinstance(ref, int) else data.index_select(0, ref)
    centred = data - centre
    gram = centred @ centred.T
    sq = gram.diagonal()
    dist = sq.unsqueeze(0) + sq.unsqueeze(1) - 2.0 * gram
    # A BLAS product need not be exactly symmetric (blocking and vector width differ between
    # CPUs), and Krum/Bulyan compare d(i, j) with d(j, i) when two candidates are left: average
    # the two halves so that such a pair is tied exactly and the tie goes to the lower index.
    # (a + b) * 0.5 == (b + a) * 0.5 bit for bit, so the result is symmetric.
    return ((dist + dist.T) * 0.5).clamp_min_(0.0), sq


def _mark(dist: Tensor, finite: Tensor | None) -> Tensor:
    """Apply the encoding of :func:`distances_and_finite`; ``finite=None``: every row is finite.

    Masks, not boolean indexing: indexing with a mask asks the device how many rows it selects.
    """
    big = torch.finfo(dist.dtype).max
    dist = torch.nan_to_num(dist, nan=big, posinf=big)
    dist.fill_diagonal_(0.0)
    if finite is not None:
        bad = ~finite
        # Covers the diagonal of a non-finite row too (bad_i | bad_i).
        dist.masked_fill_(bad.unsqueeze(0) | bad.unsqueeze(1), float("inf"))
    return dist


def pairwise_sq_distances(data: Tensor, finite: Tensor | None = None) -> Tensor:
    """Squared Euclidean distances ``[n, n]`` between the rows of ``data``.

    See :func:`distances_and_finite`, which also returns which rows are finite.
    """
    return distances_and_finite(data, finite)[0]


def distances_and_finite(data: Tensor, finite: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Squared Euclidean distances ``[n, n]`` between the rows of ``data``, and ``finite``.

    ``finite`` (boolean ``[n]``: the row holds no NaN/Inf) is computed here unless given.
    Encoding, so that plain ``min``/``topk``/``argmin`` never prefer a non-finite input:

    - a pair involving a row with NaN/Inf is ``+inf``;
    - a pair of finite rows whose distance overflowed is clamped to the dtype's largest finite
      value (it still ranks before every ``+inf`` pair);
    - the diagonal of a finite row is 0.

    Computed by :func:`_centred_gram`, centred first on the first finite row. If that row is
    far from the most central one (smallest sum of squared distances to its (n-1)//2 nearest
    rows) -- more than 4 times the central row's (n-1)//2-th nearest squared distance, e.g. a
    1e6 outlier whose size would swamp the honest distances -- it is computed again centred on
    the most central row. A reference within that radius keeps ``|c_i|^2`` of the order of the
    honest distances, which is all the centring is for.

    On the CPU (see :func:`~hapi_client.robust._tensors.host_decides`) the host takes both
    decisions, which saves work in the usual case: when ``finite`` is not given, the squared
    norms of the centred rows decide it (all finite means every row is finite; only otherwise,
    NaN/Inf inputs or an overflow, is each row checked), and the second product is computed
    only when it is used. On a GPU reading those answers back would stall the call, so the
    device decides: ``finite`` is one pass over ``data``, both products are computed and
    ``torch.where`` keeps the right one. Same result either way, and no host read on a GPU.
    """
    if host_decides(data):
        return _decided_on_host(data, finite)
    return _decided_on_device(data, finite)


def _decided_on_host(data: Tensor, finite: Tensor | None) -> tuple[Tensor, Tensor]:
    n = data.shape[0]
    if finite is None:
        first, sq = _centred_gram(data, 0)
        if all_finite(sq):
            finite = torch.ones(n, dtype=torch.bool, device=data.device)
            return _recentred_on_host(data, 0, _mark(first, None), None), finite
        finite = finite_rows(data)
    every_row = bool(finite.all())
    known_bad = None if every_row else finite
    safe = data if every_row else data.masked_fill(~finite.unsqueeze(1), 0.0)
    ref = int(torch.argmax(finite.to(torch.int8)))
    dist = _mark(_centred_gram(safe, ref)[0], known_bad)
    return _recentred_on_host(safe, ref, dist, known_bad), finite


def _recentred_on_host(safe: Tensor, ref: int, dist: Tensor, finite: Tensor | None) -> Tensor:
    """``dist`` again centred on the most central row, if ``ref`` is far from it (see above)."""
    if safe.shape[0] <= 2:
        return dist
    central, radius = _most_central(dist, finite)
    index = int(central)
    if index == ref or float(dist[ref, index]) <= 4.0 * float(radius):
        return dist
    return _mark(_centred_gram(safe, index)[0], finite)


def _decided_on_device(data: Tensor, finite: Tensor | None) -> tuple[Tensor, Tensor]:
    if finite is None:
        finite = finite_rows(data)
    # Zeroing the non-finite rows keeps NaN out of the products whatever the BLAS does with it.
    safe = data.masked_fill(~finite.unsqueeze(1), 0.0)
    ref = torch.argmax(finite.to(torch.int8)).reshape(1)
    dist = _mark(_centred_gram(safe, ref)[0], finite)
    if data.shape[0] <= 2:
        return dist, finite
    central, radius = _most_central(dist, finite)
    far = dist.index_select(0, ref).index_select(1, central) > 4.0 * radius
    again = _mark(_centred_gram(safe, central)[0], finite)
    return torch.where(far, again, dist), finite


def _most_central(dist: Tensor, finite: Tensor | None) -> tuple[Tensor, Tensor]:
    """The most central row (a one-element index tensor) and its (n-1)//2-th nearest distance.

    Most central: smallest sum of squared distances to its (n-1)//2 nearest rows, finite rows
    first, lower index on ties.
    """
    n = dist.shape[0]
    others = dist.clone()
    others.fill_diagonal_(float("inf"))
    nearest = torch.topk(others, (n - 1) // 2, dim=1, largest=False).values
    penalty = (
        torch.zeros(n, dtype=torch.int8, device=dist.device)
        if finite is None
        else (~finite).to(torch.int8)
    )
    central = rank_rows(nearest.sum(dim=1), penalty)[:1]
    return central, nearest[:, -1].index_select(0, central)


def rank_rows(score: Tensor, penalty: Tensor) -> Tensor:
    """Row indices sorted by (``penalty`` ascending, ``score`` ascending, index ascending).

    ``penalty`` is a small integer per row (0 = eligible, larger = only if nothing better is
    left): a sort on ``score`` alone could put a non-finite input next to an honest row whose
    score also overflowed to ``+inf``.
    """
    order = torch.argsort(score, stable=True)
    return order[torch.argsort(penalty[order], stable=True)]
