"""/metrics exports each extraction's ratio to the host's roofline (hapi_core.roofline)."""

from __future__ import annotations

import math

import httpx
import pytest

from .conftest import Dataset, ServerProcess
from .server_helpers import extract, metric

pytestmark = pytest.mark.swift


def test_an_extraction_exports_its_roofline_ratio(
    hapi_server: ServerProcess, dataset: Dataset
) -> None:
    # Two COS batches (20 images, b_max 16): the ratio is observed after each, kept at the end.
    body = dataset.request("resnet18", "shards/shard-000000.tar", 6)
    end = extract(hapi_server, dataset, body).end
    request, device = str(end.meta["request_id"]), str(end.meta["device"])
    text = httpx.get(f"{hapi_server.url}/metrics", timeout=10).text
    assert "# HELP hapi_roofline_ratio per running extraction" in text
    # Its job ended before its end frame was sent: it is no running request any more ...
    assert metric(hapi_server, "hapi_roofline_ratio", request=request) is None
    # ... and the device's last ratio is a ratio (its value depends on the host's load).
    last = metric(hapi_server, "hapi_roofline_ratio_last", device=device)
    assert last is not None and 0 < last < math.inf
