"""``POST /v1/timings``: what running a model's head costs on the server, measured there.

The client's split rule predicts, for every split up to the freeze index, the time per
iteration of the pipeline (server compute, bytes on the wire, client compute). The server half
of that prediction has to be measured where it runs: on the server's device, with its thread
settings, on the dataset's own images (JPEG decoding is part of the head's cost, and how well the
features compress depends on the images). The request is an extract request for the first
``samples`` images of one shard, with ``split_index`` the deepest split the client considers;
the answer times the decode and every layer up to it, and sizes every layer's output as the
wire would carry it at the request's dtype and compression.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictFloat, StrictInt, model_validator

from .requests import _INTEGRAL, ExtractRequest, _Model

__all__ = ["TimingsRequest", "TimingsResponse"]

#: Samples a timing request may ask for: enough to time a small batch, few enough to stay cheap.
MAX_TIMING_SAMPLES = 64

_Seconds = Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)]


class TimingsRequest(ExtractRequest):
    """An extract request whose features are measured instead of streamed.

    The server times layers ``[0, split_index)`` over the shard's first ``samples`` images (all
    of them when the shard holds fewer). ``b_max`` still caps the batch the server may run.
    """

    samples: Annotated[StrictInt, Field(ge=1, le=MAX_TIMING_SAMPLES), _INTEGRAL] = 8


class TimingsResponse(_Model):
    """Per-sample costs of the head on the server's device, for every split up to the request's.

    ``layer_s_per_sample[i]`` is the time of layer ``i`` (so a split ``s`` costs the decode plus
    the first ``s`` entries plus ``encode_s_per_sample[s - 1]``); ``wire_bytes_per_sample[i]`` is
    what a split after layer ``i`` ships per sample, frame overhead included.
    """

    arch: str
    device: str = Field(description="the device the head ran on, e.g. cpu or cuda:0")
    samples: Annotated[StrictInt, Field(ge=1), _INTEGRAL]
    decode_s_per_sample: _Seconds
    layer_s_per_sample: list[_Seconds]
    encode_s_per_sample: list[_Seconds]
    wire_bytes_per_sample: list[Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)]]
    load: Annotated[StrictInt, Field(ge=0), _INTEGRAL] = Field(
        description="other requests waiting or running on that device when this one was measured"
    )
    cached: bool = Field(
        description="earlier requests timed these layers too: the times are the fastest seen"
    )

    @model_validator(mode="after")
    def _lengths_match(self) -> TimingsResponse:
        n = len(self.layer_s_per_sample)
        if len(self.encode_s_per_sample) != n or len(self.wire_bytes_per_sample) != n:
            raise ValueError(
                "layer_s_per_sample, encode_s_per_sample and wire_bytes_per_sample must have "
                "one entry per layer"
            )
        return self
