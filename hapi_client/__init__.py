"""The HAPI client: profile, choose the split from bandwidth, stream features into fine-tuning.

>>> from hapi_client import HapiClient, SwiftCredentials
>>> client = HapiClient("http://127.0.0.1:8090", SwiftCredentials())
>>> result = client.finetune(model="models/efficientnet_lite0", container="photos-train",
...                          eval_container="photos-test", epochs=2, batch_size=64)
"""

from typing import TYPE_CHECKING

from hapi_contract.lazy import attach

# Resolved on first use (PEP 562, see hapi_contract.lazy): importing the package loads no torch.
if TYPE_CHECKING:
    from hapi_models import OptimizerConfig

    from .bandwidth import BandwidthEstimator
    from .client import HapiClient
    from .defaults import DEFAULT_AUTH_URL, DEFAULT_ENDPOINT, MODES
    from .errors import (
        ConfigurationError,
        DeliveryError,
        HapiClientError,
        ServerError,
        ServerUnavailableError,
        SwiftAccessError,
        SwiftUnavailableError,
        TrainingCheckpointError,
        VerificationError,
    )
    from .feature_cache import FeatureCache
    from .feature_dataset import FeatureDataset, LocalModel
    from .feature_store import DiskFeatureCache
    from .finetune import EpochMetrics, FinetuneResult, run_finetune
    from .model_store import (
        StoredModel,
        download_model,
        pretrained_model,
        resolve_model,
        upload_model,
    )
    from .options import ExtractOptions, TrainOptions
    from .planning import SplitDecision, choose_split_index, plan_split
    from .preparation import PreparedModel, prepare_model
    from .retry import DEFAULT_RETRY_BUDGET_S
    from .swift_session import SwiftCredentials, SwiftSession
    from .throttle import TokenBucket
    from .transport import HapiTransport, RetryPolicy, ShardFeatures

__getattr__, __dir__ = attach(__name__, __file__)

__all__ = [
    "DEFAULT_AUTH_URL",
    "DEFAULT_RETRY_BUDGET_S",
    "DEFAULT_ENDPOINT",
    "MODES",
    "BandwidthEstimator",
    "ConfigurationError",
    "DeliveryError",
    "DiskFeatureCache",
    "EpochMetrics",
    "ExtractOptions",
    "FeatureCache",
    "FeatureDataset",
    "LocalModel",
    "PreparedModel",
    "VerificationError",
    "prepare_model",
    "plan_split",
    "FinetuneResult",
    "HapiClient",
    "HapiClientError",
    "HapiTransport",
    "OptimizerConfig",
    "RetryPolicy",
    "ServerError",
    "ServerUnavailableError",
    "ShardFeatures",
    "SplitDecision",
    "StoredModel",
    "SwiftAccessError",
    "SwiftCredentials",
    "SwiftSession",
    "SwiftUnavailableError",
    "TokenBucket",
    "TrainingCheckpointError",
    "TrainOptions",
    "choose_split_index",
    "download_model",
    "resolve_model",
    "run_finetune",
    "upload_model",
    "pretrained_model",
]
