"""Server-side handling of missing replies: wait for the fastest q of n workers."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

from .errors import InvalidParameterError, MissingRepliesError

__all__ = ["gather_replies"]


def gather_replies(replies: Iterable[Tensor | None], q: int) -> list[Tensor]:
    """Return the first ``q`` replies that arrived, skipping dropped ones (``None``).

    Garfield's ``get_gradients(t, q_w)`` returns the fastest q_w of n_w gradients (thesis §3.3.2, *Networking*); a
    worker that sends nothing (the "drop" attack, or a crash) is simply not among them. Pass
    ``replies`` in arrival order and build the rule with ``n=q``: a synchronous, fault-free
    deployment uses q = n, while tolerating f silent workers needs q = n - f (so n >= q + f
    nodes, thesis §3.3.1). Raises :class:`MissingRepliesError` when fewer than ``q`` arrived, i.e.
    the round cannot be aggregated safely.
    """
    if isinstance(q, bool) or not isinstance(q, int) or q < 1:
        raise InvalidParameterError(f"q must be an int >= 1, got {q!r}")
    got: list[Tensor] = []
    total = 0
    for reply in replies:
        total += 1
        if reply is None:
            continue
        got.append(reply)
        if len(got) == q:
            return got
    raise MissingRepliesError(f"only {len(got)} of {total} workers replied, the rule needs q={q}")
