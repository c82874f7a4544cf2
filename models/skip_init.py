"""Building a network whose weights are about to be loaded, without drawing its random init.

A network's constructor fills every parameter from the random generator (ViT-B/16: 86 M draws,
about 1.5 s of a 2.4 s build on a 2-core CPU) and a strict load of its stored weights then
overwrites every one of them: for a model built to load weights those draws are wasted, on the
client preparing a run and on a server loading a model for its first request alike. Inside
:func:`skipped_random_init` the random initialisers leave their tensor as it is (uninitialised
memory), which the load replaces. A torch function mode is kept per thread, so a model built
with its random init on another thread at the same time is not affected.

A parameter is left as it is, its memory untouched until the load writes it. Any other tensor
a tensor-level draw (``normal_``, ``uniform_``) fills is a temporary that the initialiser may
read, so it gets a value of the draw's range (the mean, the lower end): ``trunc_normal_``, which
does not dispatch to the mode as a whole, redraws the values of its parameter that are out of
bounds into a temporary until none is; left unfilled, that temporary held the same recycled
out-of-bounds memory on every round and the loop never ended (a server building ConvNeXt-L spun
for 10 minutes). Filling the parameter itself instead kept its memory resident from the build
on: an in-proxy ViT-L/16 load peaked 1 GiB higher.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["skipped_random_init"]

#: The in-place random fills the initialisers are made of, and the initialisers themselves
#: (which dispatch to the mode as a whole while it is active). ``erfinv_`` is
#: ``trunc_normal_``'s transform of its uniform draws: as costly, and as useless here.
_RANDOM_FILLS: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.Tensor.uniform_,
        torch.Tensor.normal_,
        torch.Tensor.erfinv_,
        torch.nn.init.uniform_,
        torch.nn.init.normal_,
        torch.nn.init.trunc_normal_,
        torch.nn.init.kaiming_uniform_,
        torch.nn.init.kaiming_normal_,
        torch.nn.init.xavier_uniform_,
        torch.nn.init.xavier_normal_,
        torch.nn.init.orthogonal_,
    }
)


#: The draws that fill a temporary with a value of their range: (its argument, its default).
_IN_RANGE: dict[Callable[..., Any], tuple[str, float]] = {
    torch.Tensor.normal_: ("mean", 0.0),
    torch.Tensor.uniform_: ("from", 0.0),
}


class _SkipRandomFills(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _RANDOM_FILLS:
            tensor = args[0] if args else kwargs["tensor"]
            if func in _IN_RANGE and not isinstance(tensor, torch.nn.Parameter):
                name, default = _IN_RANGE[func]
                value = args[1] if len(args) > 1 else kwargs.get(name, default)
                with torch.no_grad():
                    tensor.fill_(value)
            return tensor
        return func(*args, **kwargs)


@contextmanager
def skipped_random_init() -> Iterator[None]:
    """Within it (on this thread), random initialisers leave their tensors unfilled. Only for
    a model whose every parameter and persistent buffer a strict load then sets."""
    with _SkipRandomFills():
        yield
