"""Weights I/O: safetensors blobs identified by their sha256. Nothing is ever unpickled."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import threading
from pathlib import Path

import torch
from safetensors.torch import save as st_save
from torch import nn

from .errors import CheckpointError, ChecksumMismatchError, WeightsError
from .safetensors_views import tensor_views

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")

#: The largest weights file read from disk: the server's and the filter's default
#: ``max_weights_bytes`` (2 GiB), so that a file read here could also be served.
MAX_WEIGHTS_BYTES = 2 * 2**30

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def read_weights_file(
    path: str | Path, *, max_bytes: int = MAX_WEIGHTS_BYTES, first: int | None = None
) -> bytes:
    """The bytes of a weights file, refused unless it is a regular file of at most ``max_bytes``.

    At most ``max_bytes + 1`` bytes are read, whatever the file claims to be: a directory, a
    device (``/dev/zero``), a FIFO or a socket is refused before anything is read (a FIFO is
    opened without blocking), and a file that grows past the limit while it is read is refused.
    ``first``: read only that many bytes from the start (the file's type and size still checked).

    Raises:
        CheckpointError: missing or unreadable, not a regular file, or over ``max_bytes``.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a file")
        raise CheckpointError(
            f"{path}: not a PyTorch or safetensors checkpoint: found {kind}, not a regular file"
        )
    with os.fdopen(fd, "rb") as f:
        if info.st_size > max_bytes:
            raise CheckpointError(_too_large(path, info.st_size, max_bytes))
        try:
            blob = f.read(max_bytes + 1 if first is None else min(first, max_bytes + 1))
        except OSError as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from exc
    if len(blob) > max_bytes:  # grew while being read
        raise CheckpointError(_too_large(path, len(blob), max_bytes, grew=True))
    return blob


def _too_large(path: Path, size: int, max_bytes: int, *, grew: bool = False) -> str:
    return (
        f"{path}: {'more than ' if grew else ''}{size} bytes, over the limit of {max_bytes} bytes "
        "for weights (the server's max_weights_bytes)"
    )


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
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


def load_weights(
    model: nn.Module,
    source: str | Path | bytes | bytearray | memoryview,
    *,
    sha256: str | None = None,
) -> str:
    """Load safetensors weights (a path or the bytes) into ``model`` strictly; return their sha256.

    A ``bytearray`` or ``memoryview`` (a blob read into one buffer, as the Swift filter reads)
    is read where it lies: the only copy the load makes is the parameters' own (issue 27: the
    plan counts the blob and the model's resident bytes, nothing more).

    When ``sha256`` is given, a blob with another digest raises :class:`ChecksumMismatchError`
    before anything is parsed.
    """
    blob: bytes | bytearray | memoryview
    if isinstance(source, bytes | bytearray | memoryview):
        blob = source
    else:
        path = Path(source)
        if path.suffix in {".pt", ".pth", ".pkl", ".bin"}:
            raise WeightsError(
                f"{path}: only .safetensors weights are accepted (pickle formats are not)"
            )
        blob = read_weights_file(path)
    digest = sha256_hex(blob)
    if sha256 is not None:
        expected = sha256.lower()
        if not _SHA256.match(expected):
            raise WeightsError(f"not a sha256 hex digest: {sha256!r}")
        if expected != digest:
            raise ChecksumMismatchError(expected, digest)
    # Views of the blob, not copies (see safetensors_views): the strict load's copy into the
    # parameters is the only one. The legacy rescale adds tensors of its own beside them and
    # writes into none.
    state = tensor_views(blob)
    state = _with_legacy_input_rescale(model, state, digest)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise WeightsError(f"weights do not fit the model: {exc}") from exc
    return digest


_LEGACY_LOGGED: set[str] = set()
_LEGACY_LOCK = threading.Lock()


def _with_legacy_input_rescale(
    model: nn.Module, state: dict[str, torch.Tensor], digest: str
) -> dict[str, torch.Tensor]:
    """``state``, with GoogLeNet's or Inception-v3's transform_input on where it has none (see
    :func:`~hapi_models.zoo.graph_families.legacy_input_rescale`); logged once per blob."""
    # Local: the zoo imports the registry, which imports this module lazily.
    from .zoo.graph_families import legacy_input_rescale

    legacy = legacy_input_rescale(model, state)
    if not legacy:
        return state
    with _LEGACY_LOCK:
        first = digest not in _LEGACY_LOGGED
        _LEGACY_LOGGED.add(digest)
    if first:
        log.warning(
            "weights %s hold no transform_input (%s): stored before it travelled with the "
            "weights, when it was always on; loading them with it on, as they were uploaded",
            digest[:12],
            ", ".join(sorted(legacy)),
        )
    return {**state, **legacy}
