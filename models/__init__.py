"""HAPI's splittable model zoo: models as ordered lists of layers that can be cut anywhere.

>>> from hapi_models import get_model
>>> model = get_model("resnet18", num_classes=10)
>>> head, tail = model.head(8), model.tail(8)
"""

from . import zoo as _zoo  # noqa: F401  (registers the architectures)
from .checkpoints import (
    check_checkpoint,
    checkpoint_format,
    import_weights,
    read_checkpoint,
    torchvision_weights,
)
from .errors import (
    CheckpointError,
    ChecksumMismatchError,
    HapiModelError,
    InputSizeError,
    PluginError,
    PretrainedWeightsUnavailableError,
    SplitIndexError,
    UnknownModelError,
    UntraceableModelError,
    WeightsError,
)
from .finetune import (
    EpochStats,
    OptimizerConfig,
    evaluate,
    prepare_for_finetuning,
    set_modes,
    train_batches,
    train_step,
)
from .folding import BatchNormFolder, fold_batch_norms, folded_parameter_bytes
from .graph_split import GraphLayers, split_graph
from .layer_timing import (
    MIN_TIMED_SAMPLES,
    TIMED_PASS_S,
    WARM_UP_SAMPLES,
    sync,
    time_runs,
    timed_samples,
    warm_up_runs,
)
from .layout import LayoutChooser, to_layout
from .listing import Listing, ModelListing, describe_model, describe_models
from .profiling import LayerProfile, ModelProfile, profile
from .registry import (
    ModelSpec,
    SplitLayout,
    broken_plugins,
    get_model,
    get_spec,
    list_models,
    thesis_models,
)
from .split_points import SplitPoint, split_points
from .splittable import SplittableModel
from .transforms import (
    DECODE_PATHS,
    DecodePath,
    ImageDecodeError,
    InputTransform,
    decode_image,
    decode_pixels,
    named_errors,
)
from .weights import (
    MAX_WEIGHTS_BYTES,
    load_weights,
    read_weights_file,
    save_weights,
    sha256_hex,
    weights_to_bytes,
)

__all__ = [
    "MIN_TIMED_SAMPLES",
    "TIMED_PASS_S",
    "WARM_UP_SAMPLES",
    "MAX_WEIGHTS_BYTES",
    "CheckpointError",
    "ChecksumMismatchError",
    "EpochStats",
    "OptimizerConfig",
    "evaluate",
    "prepare_for_finetuning",
    "set_modes",
    "train_batches",
    "train_step",
    "GraphLayers",
    "HapiModelError",
    "Listing",
    "ModelListing",
    "ImageDecodeError",
    "InputSizeError",
    "InputTransform",
    "DECODE_PATHS",
    "DecodePath",
    "decode_pixels",
    "named_errors",
    "LayerProfile",
    "LayoutChooser",
    "BatchNormFolder",
    "ModelProfile",
    "ModelSpec",
    "PluginError",
    "PretrainedWeightsUnavailableError",
    "SplitIndexError",
    "SplitLayout",
    "SplitPoint",
    "SplittableModel",
    "UnknownModelError",
    "UntraceableModelError",
    "WeightsError",
    "broken_plugins",
    "check_checkpoint",
    "checkpoint_format",
    "decode_image",
    "describe_model",
    "describe_models",
    "get_model",
    "get_spec",
    "import_weights",
    "list_models",
    "load_weights",
    "profile",
    "read_checkpoint",
    "read_weights_file",
    "save_weights",
    "sha256_hex",
    "split_graph",
    "split_points",
    "thesis_models",
    "to_layout",
    "sync",
    "time_runs",
    "timed_samples",
    "warm_up_runs",
    "fold_batch_norms",
    "folded_parameter_bytes",
    "torchvision_weights",
    "weights_to_bytes",
]
