"""LB-BSP batch balancing for heterogeneous workers (Chen et al., IEEE TCC).

Load-balanced BSP keeps synchronous SGD but gives faster workers more samples, so that every
worker finishes its iteration at about the same time; the global batch X = sum_i x_i never
changes (LB-BSP §3.1; sources in docs/references.md). Measurements and adjustments happen
only at iteration boundaries ("semi-dynamic", LB-BSP §2.3); the batch size is the only knob, so no data moves.

:class:`BatchBalancer` is Algorithm 2 of the paper (the GPU variant, LB-BSP §3.3.2) without
any ``torch.distributed``: after each iteration the caller passes every worker's measured
iteration time (and, optionally, which workers are close to their memory limit) and gets the
assignment for the next iteration.

- leader = the fastest worker among those *not* near their memory limit (the paper excludes
  workers with more than 95 % of GPU memory in use, Algorithm 2 line 2); straggler = the
  slowest worker (line 3);
- if the leader was faster than the straggler in each of the last D iterations, move Delta
  samples from the straggler to the leader (lines 7-8);
- fast-approach phase: Delta = 5, D = 5; once the assignment oscillates (a former leader is now
  the straggler, or a former straggler now the leader, §3.3.2) switch for good to the
  fine-tune phase: Delta = 1, D = 20 (the *Require* line and line 9). The switching iteration moves
  nothing, as in Algorithm 2 (line 9-10).

Deliberate differences from Algorithm 2:

- the paper leaves the assignment unchanged when the straggler holds <= Delta samples and warns
  "remove this straggler" (Algorithm 2, lines 5-6); here the straggler gives what it has above
  ``min_batch`` (default 1) and the warning (and :attr:`BatchBalancer.removal_candidate`) only
  comes once it is down to ``min_batch``, so every worker keeps at least one sample;
- the observation window slides over the last D measured iterations, including those before
  the previous move (the paper's ``for all h in {k-D, ..., k-1}``).

The weighted average that must go with unequal batches is
:class:`~hapi_client.robust.BatchWeightedAverage` (LB-BSP §3.4, eq. (7)).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .aggregators import check_count
from .errors import BalancingError

__all__ = ["MEMORY_LIMIT_FRACTION", "BatchBalancer", "Phase", "even_split", "near_memory_limit"]

logger = logging.getLogger(__name__)

#: A worker using more than this fraction of its accelerator memory takes no more samples
#: (LB-BSP excludes workers with less than 5 % free memory from being the leader, LB-BSP §3.3.2).
MEMORY_LIMIT_FRACTION = 0.95


@dataclass(frozen=True)
class Phase:
    """One phase of Algorithm 2: move ``step`` samples after a ``window`` of iterations."""

    name: Literal["fast", "fine"]
    step: int
    window: int


def even_split(global_batch: int, n_workers: int) -> list[int]:
    """Equal shares of ``global_batch`` (the first ``global_batch % n_workers`` get one more)."""
    base, extra = divmod(global_batch, n_workers)
    return [base + (1 if i < extra else 0) for i in range(n_workers)]


def near_memory_limit(
    used_fractions: Sequence[float], threshold: float = MEMORY_LIMIT_FRACTION
) -> list[bool]:
    """Flags for :meth:`BatchBalancer.update` from per-worker used-memory fractions (0..1)."""
    return [fraction > threshold for fraction in used_fractions]


class BatchBalancer:
    """Per-worker batch sizes that move samples from the slowest to the fastest worker.

    ``global_batch`` samples per iteration are split over ``n_workers`` (equally, or as
    ``initial``); call :meth:`update` once per iteration with the measured times. Phase
    parameters default to the paper's (5/5 then 1/20).
    """

    def __init__(
        self,
        global_batch: int,
        n_workers: int,
        *,
        initial: Sequence[int] | None = None,
        fast_step: int = 5,
        fast_window: int = 5,
        fine_step: int = 1,
        fine_window: int = 20,
        min_batch: int = 1,
    ) -> None:
        self.global_batch = check_count("global_batch", global_batch, 1)
        self.n_workers = check_count("n_workers", n_workers, 1)
        self.min_batch = check_count("min_batch", min_batch, 1)
        self.fast = Phase(
            "fast",
            check_count("fast_step", fast_step, 1),
            check_count("fast_window", fast_window, 1),
        )
        self.fine = Phase(
            "fine",
            check_count("fine_step", fine_step, 1),
            check_count("fine_window", fine_window, 1),
        )
        if global_batch < n_workers * min_batch:
            raise BalancingError(
                f"global_batch={global_batch} cannot give {n_workers} workers "
                f"min_batch={min_batch} samples each"
            )
        if initial is None:
            sizes = even_split(global_batch, n_workers)
        else:
            sizes = [check_count("initial batch size", x, min_batch) for x in initial]
            if len(sizes) != n_workers or sum(sizes) != global_batch:
                raise BalancingError(
                    f"initial must hold {n_workers} sizes summing to {global_batch}, got {sizes}"
                )
        self._sizes = sizes
        self._phase = self.fast
        self._history: deque[tuple[float, ...]] = deque(
            maxlen=max(self.fast.window, self.fine.window)
        )
        self._former_leaders: set[int] = set()
        self._former_stragglers: set[int] = set()
        self._iterations = 0
        self.removal_candidate: int | None = None
        """A straggler already at ``min_batch`` that still holds everyone back (LB-BSP's
        "remove this straggler" warning); None otherwise."""

    @property
    def assignment(self) -> tuple[int, ...]:
        """Current per-worker batch sizes (they always sum to ``global_batch``)."""
        return tuple(self._sizes)

    @property
    def phase(self) -> Phase:
        """The current phase (fast-approach, then fine-tune once oscillation is seen)."""
        return self._phase

    @property
    def iterations(self) -> int:
        """How many iterations have been reported through :meth:`update`."""
        return self._iterations

    def offsets(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each worker's slice of a global batch, in worker order."""
        bounds: list[tuple[int, int]] = []
        start = 0
        for size in self._sizes:
            bounds.append((start, start + size))
            start += size
        return bounds

    def _validate(
        self, times: Sequence[float], near_limit: Sequence[bool] | None
    ) -> tuple[tuple[float, ...], tuple[bool, ...]]:
        if len(times) != self.n_workers:
            raise BalancingError(f"expected {self.n_workers} iteration times, got {len(times)}")
        values = tuple(float(t) for t in times)
        if any(not math.isfinite(t) or t < 0 for t in values):
            raise BalancingError(f"iteration times must be finite and >= 0, got {values}")
        if near_limit is None:
            return values, (False,) * self.n_workers
        if len(near_limit) != self.n_workers:
            raise BalancingError(f"expected {self.n_workers} memory flags, got {len(near_limit)}")
        return values, tuple(bool(flag) for flag in near_limit)

    def update(
        self, times: Sequence[float], near_limit: Sequence[bool] | None = None
    ) -> tuple[int, ...]:
        """Report one iteration and get the batch sizes for the next one.

        ``times[i]``: worker i's measured time for the iteration just finished, with its current
        batch size (compute plus non-overlapped communication, LB-BSP §3.1). ``near_limit[i]``:
        True if worker i is close to its memory limit (see :func:`near_memory_limit`); such a
        worker is never given more samples.
        """
        values, flags = self._validate(times, near_limit)
        self._iterations += 1
        self._history.append(values)
        eligible = [i for i in range(self.n_workers) if not flags[i]]
        if not eligible:
            return self.assignment
        leader = min(eligible, key=lambda i: (values[i], i))
        straggler = max(range(self.n_workers), key=lambda i: (values[i], -i))
        if leader == straggler or values[leader] >= values[straggler]:
            return self.assignment
        if self._phase is self.fast and (
            leader in self._former_stragglers or straggler in self._former_leaders
        ):
            self._phase = self.fine
            logger.info(
                "LB-BSP: oscillation at iteration %d (leader %d, straggler %d); fine-tune "
                "phase: step %d, window %d",
                self._iterations,
                leader,
                straggler,
                self.fine.step,
                self.fine.window,
            )
            return self.assignment
        window = self._phase.window
        if len(self._history) < window:
            return self.assignment
        recent = list(self._history)[-window:]
        if not all(t[leader] < t[straggler] for t in recent):
            return self.assignment
        amount = min(self._phase.step, self._sizes[straggler] - self.min_batch)
        if amount <= 0:
            if self.removal_candidate != straggler:
                logger.warning(
                    "LB-BSP: worker %d is the straggler with only %d samples left; the job "
                    "would be faster without it",
                    straggler,
                    self._sizes[straggler],
                )
            self.removal_candidate = straggler
            return self.assignment
        self.removal_candidate = None
        self._sizes[straggler] -= amount
        self._sizes[leader] += amount
        self._former_leaders.add(leader)
        self._former_stragglers.add(straggler)
        logger.debug(
            "LB-BSP: moved %d samples from worker %d to worker %d -> %s",
            amount,
            straggler,
            leader,
            self._sizes,
        )
        return self.assignment
