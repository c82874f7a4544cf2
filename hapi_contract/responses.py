"""Response schemas: error bodies, the model list, health, and the ALL_IN_COS metrics.

Every 4xx/5xx body is an :class:`ErrorBody`. The feature stream itself is not JSON: its frames
are specified in ``docs/frames.md`` and coded by ``hapi_contract.frames``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from .requests import _INTEGRAL, _MAX_LAYERS, ARCH_PATTERN, TransformSpec, _LayerIndex, _Model

__all__ = [
    "DeviceHealth",
    "ErrorBody",
    "FinetuneEpoch",
    "FinetuneMetrics",
    "Health",
    "ModelInfo",
]


class ErrorBody(BaseModel):
    """The JSON body of every 4xx/5xx answer: a human ``detail`` and a machine ``code``.

    Extra keys (e.g. ``retry_after``, ``errors``) are allowed and kept.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    detail: StrictStr
    code: Annotated[StrictStr, Field(min_length=1, max_length=64)]


class ModelInfo(_Model):
    """One entry of ``GET /v1/models``."""

    name: Annotated[StrictStr, Field(pattern=ARCH_PATTERN)]
    num_layers: Annotated[StrictInt, Field(ge=1, le=_MAX_LAYERS), _INTEGRAL]
    default_freeze_index: _LayerIndex
    layer_names: list[StrictStr]
    transform: TransformSpec

    @model_validator(mode="after")
    def _consistent(self) -> ModelInfo:
        if len(self.layer_names) != self.num_layers:
            raise ValueError(
                f"layer_names has {len(self.layer_names)} entries, num_layers is {self.num_layers}"
            )
        if self.default_freeze_index > self.num_layers:
            raise ValueError(
                f"default_freeze_index ({self.default_freeze_index}) exceeds "
                f"num_layers ({self.num_layers})"
            )
        return self


class DeviceHealth(_Model):
    """One device's memory and load as the batch adaptation sees it."""

    name: str
    total_bytes: int = Field(ge=0)
    free_bytes: int = Field(ge=0)
    load: int = Field(ge=0, description="requests waiting or running on the device")


class Health(_Model):
    """``GET /healthz``: 200 when Swift answers its healthcheck, 503 (same body) when not."""

    status: str = Field(pattern="^(ok|degraded)$")
    swift: bool
    swift_url: str
    adaptation: bool
    devices: list[DeviceHealth]


class FinetuneEpoch(_Model):
    """One epoch of an ALL_IN_COS run, as the server measured it."""

    epoch: int = Field(ge=1)
    loss: float
    train_accuracy: float
    samples: int = Field(ge=0)
    seconds: float = Field(ge=0)
    eval_accuracy: float | None = Field(None, description="only with `eval_shards`")


class FinetuneMetrics(_Model):
    """``POST /v1/finetune``: what the run did, sent as compact JSON in ``X-Hapi-Metrics``."""

    request_id: str
    device: str
    epochs: list[FinetuneEpoch]
    server_seconds: float = Field(ge=0)
    samples: int = Field(ge=0)
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]

    def header(self) -> str:
        """The ``X-Hapi-Metrics`` header value (JSON, no spaces)."""
        return self.model_dump_json()
