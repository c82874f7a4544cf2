"""Keeping replicas identical: flat gradients in and out, and a cheap parameter checksum.

Every worker holds a full replica of the trainable tail and applies the same aggregated
gradient with the same optimizer, so the replicas stay bit-identical; the checksum (the first
8 bytes of a SHA-256 over the tensors' bytes) proves it at a few bytes per check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import torch
from torch import nn

__all__ = ["flat_gradient", "set_flat_gradient", "state_checksum", "trainable_parameters"]


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters that receive gradients, in the module's (deterministic) order."""
    return [p for p in module.parameters() if p.requires_grad]


def flat_gradient(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """All gradients as one float32 vector (zeros for a parameter without a gradient)."""
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float()
        for p in params
    ]
    if not parts:
        return torch.empty(0)
    return torch.cat(parts)


def set_flat_gradient(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Write ``flat`` (as made by :func:`flat_gradient`) into the parameters' ``.grad``."""
    total = sum(p.numel() for p in params)
    if flat.numel() != total:
        raise ValueError(f"a flat gradient of {flat.numel()} elements for parameters of {total}")
    offset = 0
    for p in params:
        chunk = flat[offset : offset + p.numel()].reshape(p.shape).to(p.device, p.dtype)
        p.grad = chunk.clone()
        offset += p.numel()


def state_checksum(tensors: Iterable[torch.Tensor]) -> int:
    """A 63-bit fingerprint of the tensors' exact bytes (order matters); equal iff bit-identical."""
    digest = hashlib.sha256()
    for t in tensors:
        data = t.detach().to("cpu").contiguous().reshape(-1)
        digest.update(str(data.dtype).encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    # 63 bits so the value also fits an int64 tensor for torch.distributed.
    return int.from_bytes(digest.digest()[:8], "big") >> 1
