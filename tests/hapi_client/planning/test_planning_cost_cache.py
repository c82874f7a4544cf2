"""The client's costs kept on disk: a new process plans without timing the layers again."""

from __future__ import annotations

from pathlib import Path

import hapi_models
import pytest
import torch

from hapi_client.datasets import get_source
from hapi_client.planning import costs
from hapi_client.planning.cost_cache import COST_FILE

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HAPI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(costs, "_client_costs", {})  # what a new process starts with
    return tmp_path


def _measure(net: hapi_models.SplittableModel, images: list[bytes]) -> costs.ClientCosts:
    return costs.measure_client_costs(net, SMALL, 3, images, torch.device("cpu"), batch=2)


def _counting() -> tuple[hapi_models.SplittableModel, list[int]]:
    net = hapi_models.get_model("alexnet", num_classes=3)
    calls = [0]
    net.layers[0].register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return net, calls


def _images() -> list[bytes]:
    return [image for image, _, _ in get_source("photos:train?per_class=1&size=48x40")][:2]


def test_a_new_process_reads_the_costs_instead_of_timing_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = _images()
    net, calls = _counting()
    first = _measure(net, images)
    assert calls[0] > 0 and (cache / COST_FILE).is_file()
    monkeypatch.setattr(costs, "_client_costs", {})
    net, calls = _counting()
    again = _measure(net, images)
    assert calls[0] == 0  # the layers did not run
    assert list(again.layer_s) == list(first.layer_s) and again.train_s == first.train_s


def test_an_unreadable_cache_is_a_miss(cache: Path) -> None:
    (cache / COST_FILE).write_text("{not json")
    net, calls = _counting()
    _measure(net, _images())
    assert calls[0] > 0
