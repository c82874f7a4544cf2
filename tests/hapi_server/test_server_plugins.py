"""A real server on whose path broken ``hapi.models`` plugins are installed: each is a 422 that
names the plugin, its package and the cause, and the server keeps serving other models; its
listing lists the others and names each broken plugin with its cause.

The plugins are a distribution on ``PYTHONPATH`` (a ``.dist-info`` with its entry points), so
only this test's own server sees them; the session's shared server is left as it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Dataset, ServerProcess
from .server_helpers import assert_error, extract, post

DIST = "broken-hapi-plugins"


def _install_broken_plugins(site: Path) -> None:
    info = site / "broken_hapi_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[hapi.models]\ncudanet = broken_hapi_cuda:build\ndictnet = broken_hapi_dict:build\n"
        "loopnet = broken_hapi_loop:build\n"
    )
    (site / "broken_hapi_cuda.py").write_text(
        "raise OSError('libcudart.so.12: cannot open shared object file')\n"
    )
    (site / "broken_hapi_dict.py").write_text(
        "def build(num_classes):\n    return {'num_classes': num_classes}\n"
    )
    # A network torch.fx cannot trace: its forward branches on the values of its input.
    (site / "broken_hapi_loop.py").write_text(
        "from torch import nn\n\n"
        "class Loop(nn.Module):\n"
        "    def forward(self, x):\n"
        "        while x.sum() > 0:\n"
        "            x = x - 1\n"
        "        return x\n\n"
        "def build(num_classes):\n    return Loop()\n"
    )


@pytest.fixture(scope="module")
def plugin_server(
    server_factory: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    site = tmp_path_factory.mktemp("broken-plugins")
    _install_broken_plugins(site)
    with pytest.MonkeyPatch.context() as mp:  # the server process inherits this environment
        mp.setenv("PYTHONPATH", str(site))
        server = server_factory(cpu_memory_budget_bytes=3 * 2**30, b_min=4)
    yield server


@pytest.mark.parametrize(
    ("arch", "cause"),
    [
        ("cudanet", "raises on import: OSError: libcudart.so.12"),
        ("dictnet", "its builder returned a dict, not an nn.Module"),
    ],
)
def test_a_broken_plugin_is_a_422_naming_it_and_others_are_served(
    plugin_server: ServerProcess, dataset: Dataset, arch: str, cause: str
) -> None:
    shard = next(iter(dataset.shards))
    body = dataset.request("resnet18", shard, 4)
    body["model"] = {**body["model"], "arch": arch}  # type: ignore[dict-item]
    error = assert_error(post(plugin_server, body, dataset.headers()), 422, "invalid_request")
    assert f"plugin {arch!r}" in error.detail and DIST in error.detail
    assert cause in error.detail
    served = extract(plugin_server, dataset, dataset.request("resnet18", shard, 4))
    assert served.labels == dataset.shards[shard][1]


def test_the_listing_lists_the_others_and_names_each_broken_plugin(
    plugin_server: ServerProcess,
) -> None:
    response = httpx.get(f"{plugin_server.url}/v1/models", timeout=600)
    assert response.status_code == 200, response.text
    listed = {model["name"] for model in response.json()}
    assert {"resnet18", "vit_b_16", "tinycnn"} <= listed
    assert not {"cudanet", "dictnet", "loopnet"} & listed
    unavailable = json.loads(response.headers["X-Hapi-Unavailable-Models"])
    assert set(unavailable) == {"cudanet", "dictnet", "loopnet"}
    assert "torch.fx cannot trace it" in unavailable["loopnet"]
    assert "its builder returned a dict" in unavailable["dictnet"]
    assert "libcudart.so.12" in unavailable["cudanet"]
    # The operator is told too, once, in the server's log.
    log = plugin_server.log.read_text(errors="replace")
    assert "loopnet cannot be listed" in log and "torch.fx cannot trace it" in log
