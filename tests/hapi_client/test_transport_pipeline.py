"""The transport's place for each extraction in its pipeline (``X-Hapi-Pipeline-Seq``): taken
when the extraction is asked for, in the client's order, and kept by its retries (unit test:
the HTTP exchange replaced; the server's side runs over HTTP in
``tests/hapi_server/test_extract_http.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hapi_client.swift_session import SwiftCredentials, SwiftSession
from hapi_client.transport import HapiTransport
from hapi_contract import HEADER_PIPELINE, HEADER_PIPELINE_SEQ, ExtractRequest

REQUEST = ExtractRequest.model_validate(
    {
        "container": "data",
        "shard": "shards/shard-000000.tar",
        "model": {"arch": "alexnet", "num_classes": 10},
        "split_index": 2,
        "transform": {"resize": 32, "crop": 32, "mean": [0.5] * 3, "std": [0.5] * 3},
        "b_max": 4,
    }
)


def test_each_extraction_takes_the_next_place_and_its_retries_keep_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transport = HapiTransport(
        "http://hapi.invalid", SwiftSession(SwiftCredentials("http://swift.invalid/auth/v1.0"))
    )
    sent: list[dict[str, str]] = []

    def exchange(label: str, container: str, shard: str, op: str, send: Any) -> Any:
        for _ in range(2):  # a first attempt and its retry
            send("http://hapi.invalid/v1/extract", {"X-Auth-Token": "t"})
        return SimpleNamespace(), 2

    monkeypatch.setattr(transport, "_request", exchange)
    monkeypatch.setattr(transport, "_extract_once", lambda url, headers, body: sent.append(headers))
    for _ in range(3):
        transport.extract(REQUEST)
    transport.close()
    assert [h[HEADER_PIPELINE_SEQ] for h in sent] == ["0", "0", "1", "1", "2", "2"]
    assert {h[HEADER_PIPELINE] for h in sent} == {transport.pipeline}
