"""Byzantine attacks for tests and benchmarks: honest gradients in, Byzantine gradients out.

An attack is built with the number of *real* attackers (``n_byzantine``) and an RNG ``seed``
and called with the honest gradients of the round (a list or a stacked tensor). It returns
``n_byzantine`` tensors with the honest element shape, dtype and device, or ``None`` for a
worker that sends nothing. The *declared* f of the aggregation rule is a separate number (as
AggregaThor's ``--nb-decl-byz-workers`` vs ``--nb-real-byz-workers``): a benchmark may run 2 real
attackers against a rule built for f = 3, or more attackers than declared to show a rule break::

    honest = [worker.gradient() for worker in workers]          # 8 honest replies
    byzantine = get_attack("alie", n_byzantine=3)(honest)       # 3 real attackers
    replies = honest + byzantine                                # what the server receives
    rule = get_aggregator("krum", n=11, f=3)                    # declared f = 3
    update = rule(gather_replies(replies, q=11))

Attacks listed by Garfield (thesis §3.3.2; Garfield paper §3.2) and evaluated there (thesis §3.6.5): random vectors,
reversed and amplified vectors (x -100), dropped vectors, "A Little Is Enough" and "Fall of
Empires". The sources give no parameters for the last two; they come from the original papers, cited per
class (see docs/references.md).
"""

from __future__ import annotations

import abc
import math
from statistics import NormalDist

import torch
from torch import Tensor

from ._tensors import Inputs, as_matrix
from .aggregators import check_count
from .errors import InputMismatchError, InvalidParameterError
from .names import ATTACKS, Registered

__all__ = [
    "ALittleIsEnough",
    "Attack",
    "DropAttack",
    "FallOfEmpires",
    "NonFiniteAttack",
    "RandomAttack",
    "ReverseAttack",
    "alie_z_max",
]


def _finite_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidParameterError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise InvalidParameterError(f"{name} must be finite, got {value}")
    return float(value)


class Attack(Registered, abc.ABC):
    """Base of the attacks: ``Attack(n_byzantine, seed=...)(honest) -> list[Tensor | None]``."""

    registry = ATTACKS

    def __init__(self, n_byzantine: int = 1, *, seed: int | None = None) -> None:
        self.n_byzantine = check_count("n_byzantine", n_byzantine, 0)
        self.seed = seed
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    @torch.no_grad()
    def __call__(self, honest: Inputs) -> list[Tensor | None]:
        """Forge this round's Byzantine replies from the honest ones."""
        matrix = as_matrix(honest)
        if self.n_byzantine == 0:
            return []
        forged = self._forge(matrix.data)
        if forged is None:
            return [None] * self.n_byzantine
        return [matrix.restore(row).clone() for row in forged]

    @abc.abstractmethod
    def _forge(self, honest: Tensor) -> Tensor | None:
        """``[h, d]`` honest rows -> ``[n_byzantine, d]`` forged rows, or None (no reply)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_byzantine={self.n_byzantine})"


class RandomAttack(Attack, name="random"):
    """Random vectors: each attacker sends an independent draw from N(mean, std^2) per coordinate.

    Garfield's "random" attack (thesis §3.6.5, "reply replaced by random values"); the sources give no
    distribution, so a Gaussian with ``mean``/``std`` parameters is used. Draws come from this
    object's CPU generator (then moved to the honest device), so a seed gives the same vectors
    on every device.
    """

    def __init__(
        self,
        n_byzantine: int = 1,
        *,
        seed: int | None = None,
        mean: float = 0.0,
        std: float = 1.0,
    ) -> None:
        super().__init__(n_byzantine, seed=seed)
        self.mean = _finite_float("mean", mean)
        self.std = _finite_float("std", std)
        if self.std < 0:
            raise InvalidParameterError(f"std must be >= 0, got {std}")

    def _forge(self, honest: Tensor) -> Tensor:
        draws = torch.randn(
            self.n_byzantine, honest.shape[1], generator=self._generator, dtype=honest.dtype
        )
        return (draws * self.std + self.mean).to(honest.device)


class ReverseAttack(Attack, name="reverse", aliases=("reversed",)):
    """Reversed and amplified: attacker j sends ``factor * g_j`` with ``factor = -100``.

    The Garfield evaluation's "reversed and amplified (x -100)" reply (thesis §3.6.5, Figure 3.5; Garfield paper §6.5).
    An attacker reverses the gradient it would honestly have sent; here attacker j takes
    honest vector j mod h as its own.
    """

    def __init__(
        self, n_byzantine: int = 1, *, seed: int | None = None, factor: float = -100.0
    ) -> None:
        super().__init__(n_byzantine, seed=seed)
        self.factor = _finite_float("factor", factor)

    def _forge(self, honest: Tensor) -> Tensor:
        own = torch.arange(self.n_byzantine, device=honest.device) % honest.shape[0]
        return honest[own] * self.factor


class DropAttack(Attack, name="drop", aliases=("dropped",)):
    """Dropped vectors: the attackers send nothing, represented as ``None`` (thesis §3.3.2).

    The server cannot wait for them: it aggregates the fastest q replies
    (:func:`~hapi_client.robust.gather_replies`, Garfield's ``get_gradients(t, q)``).
    """

    def _forge(self, honest: Tensor) -> None:
        return None


def alie_z_max(n_workers: int, n_byzantine: int) -> float:
    """z_max of "A Little Is Enough" (Baruch, Baruch and Goldberg, NeurIPS 2019).

    ``s = floor(n/2 + 1) - m`` workers must be won over (n workers, m Byzantine), and
    ``z_max = max{z : Phi(z) < (n - s) / n}`` with Phi the standard normal CDF, i.e.
    ``Phi^-1((n - s) / n)``. Raises InvalidParameterError when (n - s)/n is not in (0, 1),
    i.e. when m is 0 or the attackers are already a majority.
    """
    n = check_count("n_workers", n_workers, 1)
    m = check_count("n_byzantine", n_byzantine, 0)
    s = math.floor(n / 2 + 1) - m
    p = (n - s) / n
    if not 0.0 < p < 1.0:
        raise InvalidParameterError(
            f"A Little Is Enough needs 0 < (n - s)/n < 1 with s = floor(n/2 + 1) - m; got "
            f"n={n}, m={m}, s={s}"
        )
    return NormalDist().inv_cdf(p)


class ALittleIsEnough(Attack, name="alie", aliases=("a_little_is_enough", "little_is_enough")):
    """The "A Little Is Enough" attack (Baruch et al., NeurIPS 2019): all send mu - z * sigma.

    mu and sigma are the coordinate-wise mean and standard deviation (unbiased, as
    ``torch.std``) of the honest gradients, and z defaults to :func:`alie_z_max` for
    ``n_workers`` (default: honest + Byzantine count of the call) and ``n_byzantine``
    attackers. The shift stays within the honest spread per coordinate, which is what lets it
    pass median- and distance-based rules. Needs at least 2 honest vectors.
    """

    def __init__(
        self,
        n_byzantine: int = 1,
        *,
        seed: int | None = None,
        n_workers: int | None = None,
        z: float | None = None,
    ) -> None:
        super().__init__(n_byzantine, seed=seed)
        self.n_workers = None if n_workers is None else check_count("n_workers", n_workers, 1)
        self.z = None if z is None else _finite_float("z", z)

    def z_for(self, n_honest: int) -> float:
        """The z used when the round has ``n_honest`` honest vectors."""
        if self.z is not None:
            return self.z
        n = self.n_workers if self.n_workers is not None else n_honest + self.n_byzantine
        return alie_z_max(n, self.n_byzantine)

    def _forge(self, honest: Tensor) -> Tensor:
        if honest.shape[0] < 2:
            raise InputMismatchError("A Little Is Enough needs at least 2 honest vectors")
        z = self.z_for(honest.shape[0])
        mu = honest.mean(dim=0)
        sigma = honest.std(dim=0)
        return (mu - z * sigma).unsqueeze(0).expand(self.n_byzantine, -1)


class FallOfEmpires(
    Attack, name="foe", aliases=("fall_of_empires", "inner_product_manipulation", "ipm")
):
    """The "Fall of Empires" inner-product manipulation (Xie, Koyejo and Gupta, UAI 2020).

    Every attacker sends ``-epsilon * mean(honest)``, so the aggregate's inner product with the
    true gradient can turn negative. Default ``epsilon = 0.1``, the small value that keeps the
    Byzantine vectors close to the honest ones (the paper's setting against Krum); a large
    epsilon flips the mean outright.
    """

    def __init__(
        self, n_byzantine: int = 1, *, seed: int | None = None, epsilon: float = 0.1
    ) -> None:
        super().__init__(n_byzantine, seed=seed)
        self.epsilon = _finite_float("epsilon", epsilon)

    def _forge(self, honest: Tensor) -> Tensor:
        return (-self.epsilon * honest.mean(dim=0)).unsqueeze(0).expand(self.n_byzantine, -1)


class NonFiniteAttack(Attack, name="nonfinite"):
    """Every attacker sends a vector filled with ``value`` (NaN by default, or +-Inf).

    In none of the sources: a test and benchmark aid for the rules' non-finite handling (ByzFL has
    the same idea as its ``Inf`` attack).
    """

    def __init__(
        self, n_byzantine: int = 1, *, seed: int | None = None, value: float = math.nan
    ) -> None:
        super().__init__(n_byzantine, seed=seed)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isfinite(value):
            raise InvalidParameterError(f"value must be NaN or +-Inf, got {value!r}")
        self.value = float(value)

    def _forge(self, honest: Tensor) -> Tensor:
        return torch.full(
            (self.n_byzantine, honest.shape[1]),
            self.value,
            dtype=honest.dtype,
            device=honest.device,
        )
