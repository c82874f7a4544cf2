"""Simulated Byzantine workers: the attack a rank runs and how it forges its reply."""

from __future__ import annotations

import torch
from torch import nn

from ..robust import ALittleIsEnough, Attack, FallOfEmpires, get_attack
from .config import DistributedConfig
from .replica import flat_gradient

__all__ = ["Forger", "forger_for"]

#: Micro-batches an attacker splits its slice into to estimate the honest gradients' spread.
_ATTACK_MICRO_BATCHES = 4


def forger_for(config: DistributedConfig, rank: int) -> Forger | None:
    """The forger of ``rank`` if the configuration makes it an attacker, else None."""
    if config.attack is None or rank not in config.attackers:
        return None
    attack = get_attack(
        config.attack, n_byzantine=1, seed=config.train.seed * 7919 + rank, **config.attack_params
    )
    return Forger(attack)


class Forger:
    """Replaces an attacker's honest gradient with its attack's output."""

    def __init__(self, attack: Attack) -> None:
        self.attack = attack

    def forge(
        self,
        gradient: torch.Tensor,
        h: torch.Tensor,
        y: torch.Tensor,
        trainable: nn.Module,
        params: list[nn.Parameter],
        optimizer: torch.optim.Optimizer,
    ) -> torch.Tensor | None:
        """The attacker's reply (None: it sends nothing); ``h`` are the trainable tail's inputs.

        A worker only knows its own data. "A Little Is Enough" and "Fall of Empires" need the
        mean (and spread) of honest gradients: as in Baruch et al., the attacker estimates them
        from its own samples, here the gradients of up to 4 micro-batches of its slice.
        """
        honest = [gradient]
        if isinstance(self.attack, ALittleIsEnough | FallOfEmpires) and len(y) >= 2:
            honest = []
            for chunk in torch.arange(len(y)).tensor_split(min(_ATTACK_MICRO_BATCHES, len(y))):
                optimizer.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(trainable(h[chunk]), y[chunk]).backward()
                honest.append(flat_gradient(params))
            optimizer.zero_grad(set_to_none=True)
        forged = self.attack(honest)
        return forged[0] if forged else None
