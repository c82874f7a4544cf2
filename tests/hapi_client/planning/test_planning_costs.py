"""``measure_pipeline_costs`` on a made-up client: the server is asked while the client times its
own layers, so a cold plan waits for the slower of the two, not their sum."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hapi_client.planning import ClientCosts, costs
from hapi_contract import Compression, OutputDtype, ShardSource

FREEZE = 3
WAIT_S = 10.0


class _Transport:
    def __init__(self) -> None:
        self.asked = threading.Event()

    def timings(self, req: Any) -> Any:
        self.asked.set()
        return SimpleNamespace(
            decode_s_per_sample=0.001,
            layer_s_per_sample=[0.01] * req.split_index,
            encode_s_per_sample=[0.0] * req.split_index,
            wire_bytes_per_sample=[100.0] * req.split_index,
            load=0,
            device="cpu",
            cached=False,
        )


@pytest.fixture
def made_up(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Everything but the order of the two timings stood in for: no Swift, no model, no server."""
    sampled = costs._Sampled([b"jpeg"], 1e8, None)
    monkeypatch.setattr(costs, "_sample_images", lambda *a: sampled)
    monkeypatch.setattr(costs, "TimingsRequest", lambda **kw: SimpleNamespace(**kw))
    monkeypatch.setattr(costs, "TransformSpec", SimpleNamespace(model_validate=lambda t: t))
    source = ShardSource("c", "s")
    monkeypatch.setattr(costs, "ShardSource", SimpleNamespace(of=lambda *a: source))
    return SimpleNamespace(
        manifest=SimpleNamespace(
            shards=[SimpleNamespace(samples=16)], mean_shard_bytes_per_sample=1
        ),
        stored=SimpleNamespace(container="m", object="o", arch="alexnet", ref=lambda: None),
        net=None,
        transform=None,
        profile_spec=None,
        freeze_index=FREEZE,
    )


def _measure(prepared: Any, transport: Any, swift: Any = None) -> costs.PipelineCosts:
    return costs.measure_pipeline_costs(
        swift,
        transport,
        prepared,
        "c",
        output_dtype=OutputDtype("float32"),
        compression=Compression("none"),
        device=torch.device("cpu"),
        b_max=16,
    )


def test_the_server_is_asked_while_the_client_times_its_layers(
    made_up: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = _Transport()
    seen: list[bool] = []

    def client_costs(*args: Any, **kwargs: Any) -> ClientCosts:
        # Asked one after the other, the server's request would only start once this returned.
        seen.append(transport.asked.wait(WAIT_S))
        return ClientCosts(0.001, [0.01] * FREEZE, 0.001, 0.001, "cpu")

    monkeypatch.setattr(costs, "measure_client_costs", client_costs)
    got = _measure(made_up, transport)
    assert seen == [True]
    assert got.server is not None and got.server.layer_s == [0.01] * FREEZE
    assert got.server_missing == ""


class _Swift:
    """A made-up Swift session whose ranged reads are recorded: no bandwidth known yet."""

    bandwidth = None

    def __init__(self, transport: _Transport) -> None:
        self.transport = transport
        self.reads: list[tuple[str, str, dict[str, Any]]] = []
        self.asked_before: list[bool] = []

    def read_prefix(self, container: str, name: str, nbytes: int, **kw: Any) -> tuple[float, bytes]:
        self.reads.append((container, name, kw))
        return 1e8, b""


def test_a_folder_plan_probes_the_link_briefly_and_reads_its_images_before_asking_the_server(
    made_up: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = _Transport()
    swift = _Swift(transport)
    folder = ShardSource("c", "s", costs.DatasetLayout.FOLDER)
    monkeypatch.setattr(costs, "ShardSource", SimpleNamespace(of=lambda *a: folder))

    def sample(swift_: Any, source: Any, per_sample: float, link: float | None) -> Any:
        # The reads are timed alone: a server timing its head on Swift's core would slow them.
        swift.asked_before.append(transport.asked.is_set())
        assert link == 1e8  # the probe's rate: its share of the reads' time is the link's
        return costs._Sampled([b"jpeg"], None, 100.0)

    monkeypatch.setattr(costs, "_sample_images", sample)
    monkeypatch.setattr(
        costs,
        "measure_client_costs",
        lambda *a, **k: ClientCosts(0.001, [0.01] * FREEZE, 0.001, 0.001, "cpu"),
    )
    got = _measure(made_up, transport, swift)
    assert swift.asked_before == [False]
    # The link is probed on the weights, for at most PROBE_S seconds, not megabytes at any rate.
    assert swift.reads == [("m", "o", {"max_seconds": costs.PROBE_S})]
    assert got.probed_bytes_per_s == 1e8 and got.objects_per_s == 100.0
    assert got.server is not None


def test_per_object_request_work_leaves_out_the_links_share() -> None:
    # 48 objects, 4.8 MB in 1.0 s over a 40 MB/s link: 0.12 s of it is the link's.
    assert costs.request_s_per_object(48, 4_800_000, 1.0, 40e6) == pytest.approx(0.88 / 48)
    # Unknown link: all of the time is the requests'.
    assert costs.request_s_per_object(48, 4_800_000, 1.0, None) == pytest.approx(1.0 / 48)
    # Link-bound (the bytes alone take the whole time): nothing to say about the requests.
    assert costs.request_s_per_object(48, 4_800_000, 1.0, 4e6) is None
    # Nearly so (0.54 s of 0.55 at 5 Mbit/s): what is left is within the link rate's error.
    assert costs.request_s_per_object(3, 337_500, 0.55, 625_000) is None
