"""Exception tree of :mod:`hapi_models`."""

from __future__ import annotations

import difflib


class HapiModelError(Exception):
    """Base class of every error raised by the model zoo."""


class UnknownModelError(HapiModelError, KeyError):
    """The requested architecture is not in the registry."""

    def __init__(self, name: str, known: list[str], *, detail: str | None = None) -> None:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        detail = detail or (
            f"{len(known)} architectures are registered: "
            "`hapi models` lists them; any timm model is timm/NAME"
        )
        super().__init__(f"unknown model {name!r}{hint} ({detail})")
        self.name = name
        self.known = known

    def __str__(self) -> str:  # KeyError would otherwise quote the whole message
        return str(self.args[0])


class SplitIndexError(HapiModelError, ValueError):
    """A split or freeze index outside ``[0, num_layers]``."""


class InputSizeError(HapiModelError, ValueError):
    """A network that cannot run on the input size asked for: a crop too small for its pooling,
    or not the one size a ViT's position embedding takes. The message names the network, the
    size, its own transform's crop and the cause; the server answers it with a 422 and the
    client refuses the same size with the same words before it sends anything."""


class WeightsError(HapiModelError):
    """Weights that cannot be loaded: wrong format, wrong keys or shapes."""


class CheckpointError(WeightsError):
    """A weights file HAPI will not read: missing, not a regular file (a directory, a device, a
    FIFO), over the weights size limit, or neither a PyTorch nor a safetensors checkpoint. The
    message names the file and what was found there."""


class ChecksumMismatchError(WeightsError):
    """The sha256 of a weights blob differs from the expected one."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"weights sha256 mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class PretrainedWeightsUnavailableError(WeightsError):
    """Pretrained weights were asked for an architecture that has none offline."""


class UntraceableModelError(HapiModelError):
    """A network HAPI cannot cut into layers: torch.fx cannot trace it, it takes more than one
    input, or it returns something other than one tensor. The message names the network and
    the cause."""


class PluginError(HapiModelError):
    """An architecture plugin (the ``hapi.models`` entry-point group) that cannot be used: it
    raises on import, or its builder returns something that is not an ``nn.Module``. The
    message names the plugin, the package that installed it and the cause."""
