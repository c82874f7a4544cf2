"""The HTTP surface both sides name: paths, media types and headers (standard library only).

The server, the client and the Swift proxy filter import these instead of restating them, so a
renamed header or path changes in one place.
"""

from __future__ import annotations

__all__ = [
    "API_PREFIX",
    "CONTENT_TYPE_FRAMES",
    "CONTENT_TYPE_HAPI_REQUEST",
    "EXTRACT_PATH",
    "FINETUNE_PATH",
    "HEADER_AUTH_TOKEN",
    "HEADER_COS_BATCH_SIZE",
    "HEADER_DEVICE",
    "HEADER_EXECUTION",
    "HEADER_HAPI_REQUEST",
    "HEADER_METRICS",
    "HEADER_PIPELINE",
    "HEADER_PIPELINE_SEQ",
    "HEADER_REQUEST_ID",
    "HEADER_SAMPLES",
    "HEADER_SHA256",
    "HEADER_STORAGE_URL",
    "HEALTH_PATH",
    "METRICS_PATH",
    "MODELS_PATH",
    "PIPELINE_SEQ_PATTERN",
    "TIMINGS_PATH",
]

API_PREFIX = "/v1"
"""Path prefix of every HAPI endpoint."""

EXTRACT_PATH = f"{API_PREFIX}/extract"
"""``POST``: run a model's head over one shard and stream the features (frames)."""

FINETUNE_PATH = f"{API_PREFIX}/finetune"
"""``POST``: ALL_IN_COS fine-tuning; the body is the trained weights (safetensors)."""

TIMINGS_PATH = f"{API_PREFIX}/timings"
"""``POST``: time a model's head on the server's device over a shard's first images (JSON)."""

MODELS_PATH = f"{API_PREFIX}/models"
"""``GET``: the architectures the server can run."""

HEALTH_PATH = "/healthz"
"""``GET``: 200 when the server and its Swift answer, 503 when Swift does not."""

METRICS_PATH = "/metrics"
"""``GET``: Prometheus metrics."""

CONTENT_TYPE_FRAMES = "application/x-hapi-frames"
"""Media type of a framed tensor stream (see ``docs/frames.md`` and ``hapi_contract.frames``)."""

HEADER_AUTH_TOKEN = "X-Auth-Token"
"""The caller's Swift token; the server reads Swift as the caller with it."""

HEADER_STORAGE_URL = "X-Storage-Url"
"""The caller's Swift storage URL (account endpoint) that the token is valid for."""

HEADER_PIPELINE = "X-Hapi-Pipeline"
"""An extraction's client pipeline (any token of up to 64 characters the client keeps for its
requests): the server sends one pipeline's responses in the order they were asked for
(``docs/server.md``, send order)."""

HEADER_PIPELINE_SEQ = "X-Hapi-Pipeline-Seq"
"""An extraction's place in its pipeline (an integer of at most 18 digits, ``PIPELINE_SEQ_PATTERN``,
growing in the order the client asks): the order the server sends the pipeline's responses in.
Without it, the order they arrived in, which requests asked together (a client filling its
pipeline) do not keep: each comes on a connection of its own."""

PIPELINE_SEQ_PATTERN = r"^[0-9]{1,18}$"

HEADER_HAPI_REQUEST = "X-Hapi-Request"
"""Swift proxy filter: the header that turns a POST to an object into a HAPI request; its value
names the operation."""

CONTENT_TYPE_HAPI_REQUEST = "application/x-hapi-request+json"
"""Swift proxy filter: a content type that marks a HAPI request on its own (``extract``)."""

# Response headers of an extraction (both executions) and of a fine-tuning run.
HEADER_REQUEST_ID = "X-Hapi-Request-Id"
HEADER_DEVICE = "X-Hapi-Device"
HEADER_COS_BATCH_SIZE = "X-Hapi-Cos-Batch-Size"
HEADER_SAMPLES = "X-Hapi-Samples"
HEADER_EXECUTION = "X-Hapi-Execution"
"""Set by the Swift proxy filter: ``decoupled`` or ``in_proxy``."""
HEADER_METRICS = "X-Hapi-Metrics"
"""``POST /v1/finetune``: a :class:`hapi_contract.FinetuneMetrics` as compact JSON."""
HEADER_SHA256 = "X-Hapi-Sha256"
"""``POST /v1/finetune``: the sha256 of the returned weights."""
