"""Weights I/O: safetensors blobs identified by their sha256. Nothing is ever unpickled."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from .errors import ChecksumMismatchError, WeightsError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def weights_to_bytes(model: nn.Module) -> bytes:
    """The model's state dict as a safetensors blob (tensors made contiguous, shared ones copied)."""
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    return st_save(state, metadata={"format": "pt"})


def save_weights(model: nn.Module, path: str | Path) -> str:
    """Write the model's weights as safetensors; return their sha256 (hex)."""
    blob = weights_to_bytes(model)
    Path(path).write_bytes(blob)
    return sha256_hex(blob)


def load_weights(model: nn.Module, source: str | Path | bytes, *, sha256: str | None = None) -> str:
    """Load safetensors weights (a path or the bytes) into ``model`` strictly; return their sha256.

    When ``sha256`` is given, a blob with another digest raises :class:`ChecksumMismatchError`
    before anything is parsed.
    """
    if isinstance(source, bytes):
        blob = source
    else:
        path = Path(source)
        if path.suffix in {".pt", ".pth", ".pkl", ".bin"}:
            raise WeightsError(
                f"{path}: only .safetensors weights are accepted (pickle formats are not)"
            )
        try:
            blob = path.read_bytes()
        except OSError as exc:
            raise WeightsError(f"cannot read weights file {path}: {exc}") from exc
    digest = sha256_hex(blob)
    if sha256 is not None:
        expected = sha256.lower()
        if not _SHA256.match(expected):
            raise WeightsError(f"not a sha256 hex digest: {sha256!r}")
        if expected != digest:
            raise ChecksumMismatchError(expected, digest)
    try:
        state = st_load(blob)
    except (SafetensorError, ValueError) as exc:
        raise WeightsError(f"not a safetensors blob: {exc}") from exc
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise WeightsError(f"weights do not fit the model: {exc}") from exc
    return digest
