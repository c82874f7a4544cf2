"""Pretrained weights from outside HAPI: a user's checkpoint file or torchvision's own weights.

A checkpoint is read without ever running pickle code: safetensors with safetensors, torch files
with ``torch.load(weights_only=True)``, torch's restricted loader that rebuilds tensors and plain
containers and refuses any other object. The format is told by the first bytes, not the name;
anything else (text, a device, a directory, a file over the weights size limit) is a
:class:`~hapi_models.CheckpointError` naming the file and what was found, read within the limit. The
keys may be those of the native network (``conv1.weight`` for a torchvision ResNet, timm's for
EfficientNet-Lite0) or of the layer list (``layers.0.weight``), optionally nested under
``state_dict``/``model`` and prefixed by ``module.`` (DDP) or ``model.`` (Lightning). Every key
and shape is checked against the architecture before anything is loaded, and the class count is
read from the checkpoint's classifier.

>>> model = import_weights("resnet18", read_checkpoint("resnet18-f37072fd.pth"))
>>> model = import_weights("resnet18", torchvision_weights("resnet18"))  # downloads if needed
"""

from __future__ import annotations

import io
import logging
import pickle  # only for its exception type: nothing is unpickled here
import re
import urllib.error
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors.torch import load as st_load
from torch import nn

from .errors import CheckpointError, PretrainedWeightsUnavailableError, WeightsError
from .registry import get_model, get_spec
from .splittable import SplittableModel
from .weights import MAX_WEIGHTS_BYTES, read_weights_file
from .zoo.graph_families import input_rescale_state

__all__ = [
    "check_checkpoint",
    "checkpoint_format",
    "import_weights",
    "read_checkpoint",
    "torchvision_weights",
]

log = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]

#: Where a training framework nests the weights in the file it saves.
_NESTED = ("state_dict", "model_state_dict", "model", "module")
#: Prefixes that wrappers add to every key: DDP/DataParallel, Lightning modules.
_PREFIXES = ("module.", "model.")
#: A safetensors file starts with a little-endian u64 header length, then a JSON object.
_SAFETENSORS_HEADER = 8
#: torch.save's zip archive (the default since torch 1.6) and its older pickle stream.
_ZIP = b"PK\x03\x04"
_PICKLE_PROTO = 0x80
#: Bytes enough to tell the formats apart, and text shown of a file that is none of them.
_SNIFF = 64
_TEXT_SHOWN = 40
_SHOWN = 5


def read_checkpoint(path: str | Path, *, max_bytes: int = MAX_WEIGHTS_BYTES) -> StateDict:
    """The tensors of a checkpoint file, read without unpickling code.

    The format is told by the content, never by the file's name: a safetensors header, torch's
    zip archive or its older pickle stream. At most ``max_bytes + 1`` bytes are read (see
    :func:`~hapi_models.weights.read_weights_file`).

    Raises:
        CheckpointError: missing, not a regular file, over ``max_bytes``, or neither PyTorch
            nor safetensors (the message names the file and what was found).
        WeightsError: an object torch's restricted loader refuses (a pickled class, a whole
            ``nn.Module``), or no tensors in it.
    """
    path = Path(path)
    blob = read_weights_file(path, max_bytes=max_bytes)
    kind = checkpoint_format(path, blob[:_SNIFF], len(blob))
    if kind == "safetensors":
        try:
            return dict(st_load(blob))
        except Exception as exc:  # SafetensorError, ValueError, ...: any malformed content
            raise CheckpointError(
                f"{path}: not a PyTorch or safetensors checkpoint: a safetensors header that "
                f"safetensors refuses ({exc})"
            ) from exc
    try:
        # From the bytes, never the path: torch.load picks safetensors by a path's suffix.
        loaded = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise WeightsError(
            f"{path}: holds Python objects other than tensors (a pickled nn.Module or class?), "
            "which torch's restricted loader (weights_only=True) refuses and HAPI never "
            "unpickles. Save the state dict instead: torch.save(model.state_dict(), path), or "
            "safetensors"
        ) from exc
    except Exception as exc:  # a damaged archive or pickle stream fails in many ways
        raise CheckpointError(
            f"{path}: not a PyTorch or safetensors checkpoint: {kind} that torch cannot read "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return _tensors_of(loaded, path)


def checkpoint_format(path: str | Path, head: bytes, size: int) -> str:
    """What a checkpoint's first bytes ``head`` (of ``size`` in all) say it is.

    Returns ``"safetensors"``, ``"a torch zip archive"`` or ``"a torch pickle stream"``.

    Raises:
        CheckpointError: none of these, naming the file and what was found.
    """
    if head.startswith(_ZIP):
        return "a torch zip archive"
    if len(head) >= 2 and head[0] == _PICKLE_PROTO and 2 <= head[1] <= 5:
        return "a torch pickle stream"
    if head[_SAFETENSORS_HEADER : _SAFETENSORS_HEADER + 1] == b"{":
        declared = int.from_bytes(head[:_SAFETENSORS_HEADER], "little")
        available = size - _SAFETENSORS_HEADER
        if 0 < declared <= available:
            return "safetensors"
        raise CheckpointError(
            f"{path}: not a PyTorch or safetensors checkpoint: a safetensors header declaring "
            f"{declared} bytes of JSON, but only {available} bytes follow its length"
        )
    raise CheckpointError(f"{path}: not a PyTorch or safetensors checkpoint: found {_found(head)}")


def check_checkpoint(path: str | Path, *, max_bytes: int = MAX_WEIGHTS_BYTES) -> str:
    """Refuse a file that cannot be a checkpoint, reading only its first bytes.

    The cheap part of :func:`read_checkpoint` (file type, size, format), for a command to fail
    before it connects anywhere. Returns the format, as :func:`checkpoint_format`.

    Raises:
        CheckpointError: as :func:`read_checkpoint`.
    """
    path = Path(path)
    head = read_weights_file(path, max_bytes=max_bytes, first=_SNIFF)
    return checkpoint_format(path, head, path.stat().st_size)


def _found(head: bytes) -> str:
    if not head:
        return "an empty file"
    text = ""
    for cut in range(4):  # the head may end inside a multi-byte character
        try:
            text = head[: len(head) - cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    if text and all(c.isprintable() or c in "\t\r\n" for c in text):
        shown = text if len(text) <= _TEXT_SHOWN else text[:_TEXT_SHOWN] + "..."
        return f"text {shown!r}"
    return f"binary data starting {head[:_SAFETENSORS_HEADER].hex(' ')}"


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
    # torchvision builds these networks with transform_input=True for its own weights only.
    return {**dict(state), **input_rescale_state(arch, on=True)}


def _densenet_key(key: str) -> str:
    # torchvision's DenseNet files predate its module names ('norm.1' -> 'norm1'); torchvision
    # renames them in densenet._load_state_dict, which neither path here goes through.
    return _DENSE_LEGACY.sub(r"\1\2", key)


_DENSE_LEGACY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$"
)
_LEGACY_KEYS: dict[str, Callable[[str], str]] = {
    name: _densenet_key for name in ("densenet121", "densenet161", "densenet169", "densenet201")
}
# The auxiliary classifiers that GoogLeNet and Inception-v3 train and their eval graph never runs
# (the models are built without them; see hapi_models.zoo.graph_families): torchvision's files
# hold their weights, which are dropped rather than refused as unknown.
_UNUSED_PREFIXES: dict[str, tuple[str, ...]] = {
    "googlenet": ("aux1.", "aux2."),
    "inception_v3": ("AuxLogits.",),
}


def import_weights(
    arch: str,
    state: Mapping[str, torch.Tensor],
    *,
    num_classes: int | None = None,
    transform_input: bool | None = None,
) -> SplittableModel:
    """A model of ``arch`` holding ``state``, every key and shape checked first.

    The class count is the checkpoint's (its classifier's rows); ``num_classes``, when given,
    must agree with it (fine-tuning replaces the classifier anyway).

    GoogLeNet and Inception-v3 re-normalise their input when built with torchvision's
    ``transform_input``, which a checkpoint does not record. torchvision's rule decides: on
    with its own pretrained weights (:func:`torchvision_weights` says so in the state), off
    for any other checkpoint, as ``googlenet(weights=None)`` trains; ``transform_input``
    states it instead (a model fine-tuned from torchvision's weights was trained with it on).
    The choice is logged and stored with the weights, so the server runs the same network.

    Raises:
        WeightsError: keys missing or unknown, shapes that differ, or a class count that
            contradicts ``num_classes``; the message lists them under the native names.
    """
    with torch.device("meta"):  # shapes and key names only: no memory, no initialisation cost
        probe = get_model(arch, num_classes=1000)
    native_keys = probe.native_keys
    state = _strip_prefix(dict(state), set(native_keys) | set(native_keys.values()))
    unused = _UNUSED_PREFIXES.get(arch, ())
    dropped = [k for k in state if k.startswith(unused)]
    if dropped:
        log.warning(
            "%s: dropping the %d weights of the auxiliary classifiers (%s): only training "
            "runs them, and HAPI builds the network without them",
            arch,
            len(dropped),
            ", ".join(p.rstrip(".") for p in unused),
        )
        state = {k: v for k, v in state.items() if not k.startswith(unused)}
    state = _with_transform_input(arch, state, transform_input)
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


def _with_transform_input(arch: str, state: StateDict, on: bool | None) -> StateDict:
    """``state`` holding ``arch``'s transform_input: the checkpoint's, or ``on``, or off."""
    rescale = input_rescale_state(arch, on=bool(on))
    if not rescale:
        if on is not None:
            raise WeightsError(f"{arch} has no transform_input (GoogLeNet and Inception-v3 do)")
        return state
    held = [k for k in state if k.endswith(tuple(rescale))]
    if held and on is None:
        return state  # stored by HAPI, or torchvision_weights: the checkpoint says
    state = {k: v for k, v in state.items() if k not in held}
    if on is None:
        log.warning(
            "%s: transform_input off, as torchvision builds it for any checkpoint but its own "
            "pretrained weights (googlenet(weights=None) trains without it); a model "
            "fine-tuned from torchvision's weights was trained with it on: say "
            "transform_input=True",
            arch,
        )
    else:
        log.info("%s: transform_input %s, as asked", arch, "on" if on else "off")
    return {**state, **rescale}


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
