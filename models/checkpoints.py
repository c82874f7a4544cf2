"""Pretrained weights from outside HAPI: a user's checkpoint file or torchvision's own weights.

A checkpoint is read without ever running pickle code: ``.safetensors`` with safetensors, torch
files (``.pth``/``.pt``/``.ckpt``/``.bin``) with ``torch.load(weights_only=True)``, torch's
restricted loader that rebuilds tensors and plain containers and refuses any other object. The
keys may be those of the native network (``conv1.weight`` for a torchvision ResNet, timm's for
EfficientNet-Lite0) or of the layer list (``layers.0.weight``), optionally nested under
``state_dict``/``model`` and prefixed by ``module.`` (DDP) or ``model.`` (Lightning). Every key
and shape is checked against the architecture before anything is loaded, and the class count is
read from the checkpoint's classifier.

>>> model = import_weights("resnet18", read_checkpoint("resnet18-f37072fd.pth"))
>>> model = import_weights("resnet18", torchvision_weights("resnet18"))  # downloads if needed
"""

from __future__ import annotations

import logging
import pickle  # only for its exception type: nothing is unpickled here
import re
import urllib.error
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from torch import nn

from .errors import PretrainedWeightsUnavailableError, WeightsError
from .registry import get_model, get_spec
from .splittable import SplittableModel

__all__ = ["import_weights", "read_checkpoint", "torchvision_weights"]

log = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]

#: Where a training framework nests the weights in the file it saves.
_NESTED = ("state_dict", "model_state_dict", "model", "module")
#: Prefixes that wrappers add to every key: DDP/DataParallel, Lightning modules.
_PREFIXES = ("module.", "model.")
_SAFETENSORS_HEADER = 8
_SHOWN = 5


def read_checkpoint(path: str | Path) -> StateDict:
    """The tensors of a checkpoint file, read without unpickling code.

    Raises:
        WeightsError: unreadable file, an object torch's restricted loader refuses (a pickled
            class, a whole ``nn.Module``), or no tensors in it.
    """
    path = Path(path)
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise WeightsError(f"cannot read checkpoint {path}: {exc}") from exc
    if _looks_like_safetensors(blob):
        try:
            return dict(st_load(blob))
        except (SafetensorError, ValueError) as exc:
            raise WeightsError(f"{path}: not a valid safetensors file: {exc}") from exc
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise WeightsError(
            f"{path}: holds Python objects other than tensors (a pickled nn.Module or class?), "
            "which torch's restricted loader (weights_only=True) refuses and HAPI never "
            "unpickles. Save the state dict instead: torch.save(model.state_dict(), path), or "
            "safetensors"
        ) from exc
    except (RuntimeError, EOFError, ValueError, OSError) as exc:  # not a torch file at all
        raise WeightsError(f"{path}: neither safetensors nor a torch checkpoint: {exc}") from exc
    return _tensors_of(loaded, path)


def _looks_like_safetensors(blob: bytes) -> bool:
    # The format starts with a little-endian u64 header length, then a JSON object.
    if len(blob) < _SAFETENSORS_HEADER + 2:
        return False
    size = int.from_bytes(blob[:_SAFETENSORS_HEADER], "little")
    return (
        0 < size <= len(blob) - _SAFETENSORS_HEADER
        and blob[_SAFETENSORS_HEADER : _SAFETENSORS_HEADER + 1] == b"{"
    )


def _tensors_of(loaded: object, path: Path) -> StateDict:
    if isinstance(loaded, Mapping):
        for key in _NESTED:
            inner = loaded.get(key)
            if (
                isinstance(inner, Mapping)
                and inner
                and all(isinstance(v, torch.Tensor) for v in inner.values())
            ):
                log.info("%s: using the weights nested under %r", path, key)
                loaded = inner
                break
    if not isinstance(loaded, Mapping) or not loaded:
        raise WeightsError(
            f"{path}: expected a state dict (names -> tensors), got {type(loaded).__name__}"
        )
    state = {str(k): v for k, v in loaded.items() if isinstance(v, torch.Tensor)}
    skipped = sorted(str(k) for k, v in loaded.items() if not isinstance(v, torch.Tensor))
    if not state:
        raise WeightsError(f"{path}: no tensors in the checkpoint (keys: {_show(skipped)})")
    if skipped:
        log.warning(
            "%s: ignoring %d entries that are not tensors: %s", path, len(skipped), _show(skipped)
        )
    return state


def torchvision_weights(arch: str, *, progress: bool = True) -> StateDict:
    """torchvision's default pretrained weights for ``arch``, from torch's hub cache or downloaded.

    Loaded with ``weights_only=True`` (torchvision's own loader does not restrict them) and the
    file's hash checked. Without internet the file can be put into the cache by hand: the error
    names the URL and the path.

    Raises:
        PretrainedWeightsUnavailableError: not a torchvision architecture, or the file is
            neither cached nor downloadable.
    """
    from torchvision.models import get_model_weights  # local: torchvision is slow to import

    get_spec(arch)  # an unknown name fails with the registry's list
    try:
        weights = get_model_weights(arch).DEFAULT  # type: ignore[attr-defined]
    except ValueError:
        raise PretrainedWeightsUnavailableError(
            f"{arch} has no torchvision weights (it is not a torchvision model); use a checkpoint "
            "file of your own"
            + (", or weights='imagenet' (packaged)" if get_spec(arch).has_pretrained else "")
        ) from None
    url = str(weights.url)
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name
    try:
        state = weights.get_state_dict(progress=progress, check_hash=True, weights_only=True)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise PretrainedWeightsUnavailableError(
            f"torchvision's {weights} weights are not cached and could not be downloaded from "
            f"{url} ({exc}). Fetch the file where the internet is reachable and put it at "
            f"{cached} (torch's hub cache: $TORCH_HOME/hub/checkpoints), or pass the file itself"
        ) from exc
    except RuntimeError as exc:  # check_hash: a partial or altered file in the cache
        raise PretrainedWeightsUnavailableError(f"{cached}: {exc}; delete it and retry") from exc
    return dict(state)


def _densenet_key(key: str) -> str:
    # torchvision's DenseNet files predate its module names ('norm.1' -> 'norm1'); torchvision
    # renames them in densenet._load_state_dict, which neither path here goes through.
    return _DENSE_LEGACY.sub(r"\1\2", key)


_DENSE_LEGACY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$"
)
_LEGACY_KEYS: dict[str, Callable[[str], str]] = {"densenet121": _densenet_key}


def import_weights(
    arch: str, state: Mapping[str, torch.Tensor], *, num_classes: int | None = None
) -> SplittableModel:
    """A model of ``arch`` holding ``state``, every key and shape checked first.

    The class count is the checkpoint's (its classifier's rows); ``num_classes``, when given,
    must agree with it (fine-tuning replaces the classifier anyway).

    Raises:
        WeightsError: keys missing or unknown, shapes that differ, or a class count that
            contradicts ``num_classes``; the message lists them under the native names.
    """
    with torch.device("meta"):  # shapes and key names only: no memory, no initialisation cost
        probe = get_model(arch, num_classes=1000)
    native_keys = probe.native_keys
    state = _strip_prefix(dict(state), set(native_keys) | set(native_keys.values()))
    if fix := _LEGACY_KEYS.get(arch):
        state = {fix(k): v for k, v in state.items()}
    ours = _to_layer_keys(state, native_keys)
    native_of = {v: k for k, v in native_keys.items()}
    classes = _classes_of(probe, ours)
    if classes is None:  # no classifier under its name: say everything that does not fit
        _check_fit(arch, probe, ours, native_of)
        raise WeightsError(f"the checkpoint has no classifier weight for {arch}")
    if num_classes is not None and num_classes != classes:
        raise WeightsError(
            f"the checkpoint's classifier has {classes} classes but num_classes={num_classes}; "
            "leave it out (fine-tuning gives the model a classifier for the dataset)"
        )
    with torch.device("meta"):
        shaped = get_model(arch, num_classes=classes)
    for key, value in shaped.state_dict().items():
        # Checkpoints written before BatchNorm counted its batches (torchvision's DenseNet
        # among them) lack the counter; it only matters for momentum=None, so start it at 0.
        if key.endswith(".num_batches_tracked") and key not in ours:
            ours[key] = torch.zeros((), dtype=value.dtype)
    _check_fit(arch, shaped, ours, native_of)
    model = get_model(arch, num_classes=classes)
    model.load_state_dict(ours, strict=True)
    model.eval()
    return model


def _strip_prefix(state: StateDict, known: set[str]) -> StateDict:
    for prefix in _PREFIXES:
        if all(k.startswith(prefix) for k in state) and not any(k in known for k in state):
            state = {k.removeprefix(prefix): v for k, v in state.items()}
    return state


def _to_layer_keys(state: StateDict, native_keys: Mapping[str, str]) -> StateDict:
    if all(k.startswith("layers.") for k in state):
        return state
    return {native_keys.get(k, k): v for k, v in state.items()}


def _classes_of(probe: SplittableModel, state: StateDict) -> int | None:
    """Rows of the checkpoint's final linear layer, or None when it has none under that name."""
    last = [(k, m) for k, m in probe.layers[-1].named_modules() if isinstance(m, nn.Linear)]
    if not last:
        return 1000
    name = last[-1][0]
    key = f"layers.{probe.num_layers - 1}.{name + '.' if name else ''}weight"
    weight = state.get(key)
    return int(weight.shape[0]) if weight is not None and weight.dim() == 2 else None


def _check_fit(arch: str, model: nn.Module, state: StateDict, native_of: Mapping[str, str]) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unknown = [k for k in state if k not in expected]
    wrong = [
        f"{native_of.get(k, k)}: checkpoint {list(state[k].shape)}, {arch} {list(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing ({_show([native_of.get(k, k) for k in missing])})")
    if unknown:
        problems.append(f"{len(unknown)} unknown ({_show(unknown)})")
    if wrong:
        problems.append(f"{len(wrong)} of another shape ({_show(wrong)})")
    if problems:
        raise WeightsError(f"the checkpoint does not fit {arch}: " + "; ".join(problems))


def _show(items: list[str]) -> str:
    more = f", ... {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more
