"""Input normalisation shared by every rule: list or stacked tensor -> one ``[n, d]`` matrix."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import InputMismatchError

__all__ = [
    "HOST_DEVICE_TYPES",
    "Inputs",
    "Matrix",
    "all_finite",
    "as_matrix",
    "check_inputs",
    "finite_rows",
    "host_decides",
    "stack_checked",
    "to_device",
    "work_dtype",
]

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


#: Device types whose kernels run in step with Python, so reading a value back (``float(t)``,
#: ``bool(t)``) costs no more than the read. On every other device (CUDA, MPS, XPU) that read
#: waits for all queued kernels and the host then has to launch the rest, so the rules decide on
#: the device there (``torch.where``, masks) and read nothing back. Tests set it to ``frozenset()``
#: to run those device-side paths on the CPU.
HOST_DEVICE_TYPES: frozenset[str] = frozenset({"cpu"})


def host_decides(data: Tensor) -> bool:
    """True if the rules may branch on values of ``data`` read back to Python (see above)."""
    return data.device.type in HOST_DEVICE_TYPES


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the rules compute in: ``dtype`` promoted to at least float32."""
    return torch.promote_types(dtype, torch.float32)


def check_inputs(inputs: Sequence[Tensor], n: int | None = None) -> list[Tensor]:
    """The list ``inputs`` after the checks of :func:`as_matrix`, not stacked."""
    items = list(inputs)
    if not items:
        raise InputMismatchError("no inputs to aggregate")
    first = items[0]
    if isinstance(first, Tensor):
        shape, dtype, device = first.shape, first.dtype, first.device
        # One pass with cheap comparisons: this runs on every call, and on a GPU the host's
        # time before the first launch adds to the call's latency.
        if all(
            isinstance(item, Tensor)
            and item.shape == shape
            and item.dtype == dtype
            and item.device == device
            for item in items
        ):
            _check_count_and_dtype(len(items), dtype, n)
            return items
    _explain_mismatch(items)
    raise AssertionError("unreachable: _explain_mismatch raises")  # pragma: no cover


def _explain_mismatch(items: Sequence[object]) -> None:
    """Raise :class:`InputMismatchError` naming the first input that differs from input 0."""
    for i, item in enumerate(items):
        if not isinstance(item, Tensor):
            hint = ""
            if item is None:
                hint = " (a dropped reply: use gather_replies(replies, q), rule with n=q)"
            raise InputMismatchError(
                f"input {i} is {type(item).__name__}, expected a torch.Tensor{hint}"
            )
    first = items[0]
    assert isinstance(first, Tensor)
    for i, item in enumerate(items[1:], start=1):
        assert isinstance(item, Tensor)
        if item.shape != first.shape:
            raise InputMismatchError(
                f"input {i} has shape {tuple(item.shape)}, input 0 has {tuple(first.shape)}"
            )
        if item.device != first.device:
            raise InputMismatchError(f"input {i} is on {item.device}, input 0 is on {first.device}")
        if item.dtype != first.dtype:
            raise InputMismatchError(f"input {i} has dtype {item.dtype}, input 0 has {first.dtype}")


def _check_count_and_dtype(count: int, dtype: torch.dtype, n: int | None) -> None:
    if n is not None and count != n:
        raise InputMismatchError(f"expected n={n} inputs, got {count}")
    if not dtype.is_floating_point:
        raise InputMismatchError(f"inputs must be floating point, got {dtype}")


def as_matrix(inputs: Inputs, n: int | None = None) -> Matrix:
    """Check ``inputs`` and flatten them to ``[n, d]``.

    Raises :class:`InputMismatchError` when the count differs from ``n`` (if given), when the
    tensors disagree in shape, device or dtype, when an entry is not a tensor (a dropped reply is
    ``None``: filter replies with :func:`hapi_client.robust.gather_replies` first) or when the
    dtype is not floating point.
    """
    if not isinstance(inputs, Tensor):
        return stack_checked(check_inputs(inputs, n))
    if inputs.ndim == 0:
        raise InputMismatchError(
            "a stacked input needs a leading dimension of size n; got a 0-d tensor"
        )
    _check_count_and_dtype(int(inputs.shape[0]), inputs.dtype, n)
    return _flatten(inputs, owned=False)


def stack_checked(items: list[Tensor]) -> Matrix:
    """:func:`as_matrix` of a list that :func:`check_inputs` accepted."""
    return _flatten(torch.stack(items), owned=True)


def _flatten(stacked: Tensor, owned: bool) -> Matrix:
    count = int(stacked.shape[0])
    element_shape = stacked.shape[1:]
    data = stacked.reshape(count, -1)
    work = work_dtype(stacked.dtype)
    if data.dtype != work:
        data, owned = data.to(work), True
    return Matrix(data=data, shape=element_shape, dtype=stacked.dtype, owned=owned)


def to_device(values: Tensor, device: torch.device) -> Tensor:
    """``values`` (a small CPU tensor) copied to ``device`` without waiting for the device.

    A plain copy to a GPU waits for every queued kernel (torch synchronises the stream after a
    copy from pageable memory); from pinned memory the copy is queued like a kernel, and torch
    keeps the pinned block alive until the copy has run.
    """
    if device.type == "cuda":
        return values.pin_memory().to(device, non_blocking=True)
    return values.to(device)


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
