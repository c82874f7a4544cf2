"""Input normalisation shared by every rule: list or stacked tensor -> one ``[n, d]`` matrix."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import InputMismatchError

__all__ = ["Inputs", "Matrix", "all_finite", "as_matrix", "finite_rows"]

#: What every rule and pre-aggregation step accepts: n tensors of one shape, or one stacked tensor
#: whose first dimension is n.
Inputs = Sequence[Tensor] | Tensor


@dataclass(frozen=True)
class Matrix:
    """The inputs flattened to ``data`` of shape ``[n, d]`` plus what is needed to undo it.

    ``data`` is at least float32 (half and bfloat16 are promoted: ``torch.cdist`` and the sums of
    squared distances lose too much in 16 bits) and may be a view of the caller's tensor, so rules
    must never write into it unless ``owned``: True when ``data`` is a tensor made here (a stack
    of a list, a dtype promotion) that nobody else holds.
    """

    data: Tensor
    shape: torch.Size
    dtype: torch.dtype
    owned: bool = False

    @property
    def n(self) -> int:
        return int(self.data.shape[0])

    def restore(self, flat: Tensor) -> Tensor:
        """Give ``flat`` (``[d]``) the callers' element shape and dtype."""
        return flat.reshape(self.shape).to(self.dtype)

    def restore_stack(self, rows: Tensor) -> Tensor:
        """Give ``rows`` (``[k, d]``) the shape ``[k, *shape]`` and the callers' dtype."""
        return rows.reshape(rows.shape[0], *self.shape).to(self.dtype)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def as_matrix(inputs: Inputs, n: int | None = None) -> Matrix:
    """Check ``inputs`` and flatten them to ``[n, d]``.

    Raises :class:`InputMismatchError` when the count differs from ``n`` (if given), when the
    tensors disagree in shape, device or dtype, when an entry is not a tensor (a dropped reply is
    ``None``: filter replies with :func:`hapi_client.robust.gather_replies` first) or when the
    dtype is not floating point.
    """
    if isinstance(inputs, Tensor):
        stacked = inputs
        if stacked.ndim == 0:
            raise InputMismatchError(
                "a stacked input needs a leading dimension of size n; got a 0-d tensor"
            )
    else:
        items = list(inputs)
        if not items:
            raise InputMismatchError("no inputs to aggregate")
        for i, item in enumerate(items):
            if not isinstance(item, Tensor):
                hint = ""
                if item is None:
                    hint = " (a dropped reply: use gather_replies(replies, q), rule with n=q)"
                raise InputMismatchError(
                    f"input {i} is {type(item).__name__}, expected a torch.Tensor{hint}"
                )
        first = items[0]
        for i, item in enumerate(items[1:], start=1):
            if item.shape != first.shape:
                raise InputMismatchError(
                    f"input {i} has shape {tuple(item.shape)}, input 0 has {tuple(first.shape)}"
                )
            if item.device != first.device:
                raise InputMismatchError(
                    f"input {i} is on {item.device}, input 0 is on {first.device}"
                )
            if item.dtype != first.dtype:
                raise InputMismatchError(
                    f"input {i} has dtype {item.dtype}, input 0 has {first.dtype}"
                )
        stacked = torch.stack(items)
    count = int(stacked.shape[0])
    if n is not None and count != n:
        raise InputMismatchError(f"expected n={n} inputs, got {count}")
    if not stacked.is_floating_point():
        raise InputMismatchError(f"inputs must be floating point, got {stacked.dtype}")
    element_shape = stacked.shape[1:]
    data = stacked.reshape(count, -1)
    owned = stacked is not inputs
    work = _work_dtype(stacked.dtype)
    if data.dtype != work:
        data, owned = data.to(work), True
    return Matrix(data=data, shape=element_shape, dtype=stacked.dtype, owned=owned)


def finite_rows(data: Tensor) -> Tensor:
    """Boolean ``[n]``: True where a row holds no NaN and no +-Inf."""
    return torch.isfinite(data).all(dim=1)


def all_finite(values: Tensor) -> bool:
    """True if ``values`` holds no NaN and no +-Inf.

    A finite sum proves it with one reduction to a scalar (several times cheaper than
    ``isfinite(values).all()``, which writes a boolean per element); only a non-finite sum, from
    a non-finite value or from finite values whose sum overflowed, needs the per-element check.
    """
    return math.isfinite(float(values.sum())) or bool(torch.isfinite(values).all())
