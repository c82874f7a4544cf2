"""``hapi stack up`` runs the proxy with the filter, pointed at the stack's own HAPI server."""

from __future__ import annotations

import configparser
from pathlib import Path

import hapi_models
import pytest
import torch

from hapi_stack import HAPI_FILTER, StackConfig, down, proxy_filters, render_proxy_conf, up
from tests.hapi_server.conftest import make_images, shard_bytes
from tests.swift_middleware.mw_support import IMAGE_SIDE, extract


def _conf(config: StackConfig) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(render_proxy_conf(config))
    return parser


def test_the_filter_follows_tempauth_when_the_stack_runs_the_hapi_server(tmp_path: Path) -> None:
    config = StackConfig(state_dir=tmp_path, hapi_server=True, proxy_port=9100, hapi_port=9190)
    conf = _conf(config)
    pipeline = conf["pipeline:main"]["pipeline"].split()
    assert pipeline[pipeline.index("tempauth") + 1] == HAPI_FILTER
    section = conf[f"filter:{HAPI_FILTER}"]
    assert section["use"] == "egg:hapi#hapi"
    assert section["hapi_servers"] == "http://127.0.0.1:9190"
    assert section["swift_url"] == "http://127.0.0.1:9100"


def test_no_filter_without_the_hapi_server(tmp_path: Path) -> None:
    conf = _conf(StackConfig(state_dir=tmp_path))
    assert HAPI_FILTER not in conf["pipeline:main"]["pipeline"].split()
    assert not conf.has_section(f"filter:{HAPI_FILTER}")


def test_own_filter_options_override_the_defaults(tmp_path: Path) -> None:
    config = StackConfig(
        state_dir=tmp_path,
        hapi_server=True,
        proxy_extra_pipeline=["other", HAPI_FILTER],
        proxy_extra_filters={
            HAPI_FILTER: {"execution": "in_proxy"},
            "other": {"use": "egg:swift#name_check"},
        },
    )
    pipeline, filters = proxy_filters(config)
    assert pipeline == ["other", HAPI_FILTER]  # the given order is kept
    assert filters[HAPI_FILTER]["execution"] == "in_proxy"
    assert filters[HAPI_FILTER]["use"] == "egg:hapi#hapi"
    assert filters["other"] == {"use": "egg:swift#name_check"}


def test_a_named_filter_without_options_gets_the_entry_point(tmp_path: Path) -> None:
    config = StackConfig(state_dir=tmp_path, proxy_extra_pipeline=[HAPI_FILTER])
    assert proxy_filters(config)[1] == {HAPI_FILTER: {"use": "egg:hapi#hapi"}}


@pytest.mark.swift
@pytest.mark.slow
def test_stack_up_serves_hapi_requests_through_swift(tmp_path: Path) -> None:
    stack = up(StackConfig.on_free_ports(state_dir=tmp_path / "stack", hapi_server=True))
    try:
        conn = stack.connection()
        conn.put_container("data")
        conn.put_container("models")
        images, labels = make_images(6, seed=3, side=IMAGE_SIDE)
        conn.put_object("data", "shard-0.tar", shard_bytes(images, labels))
        torch.manual_seed(0)
        blob = hapi_models.weights_to_bytes(hapi_models.get_model("alexnet", num_classes=3))
        conn.put_object("models", "alexnet.safetensors", blob)
        storage_url, token = conn.get_auth()
        conn.close()
        body = {
            "model": {
                "arch": "alexnet",
                "num_classes": 3,
                "weights": {
                    "container": "models",
                    "object": "alexnet.safetensors",
                    "sha256": hapi_models.sha256_hex(blob),
                },
            },
            "split_index": 3,
            "transform": {
                "resize": IMAGE_SIDE,
                "crop": IMAGE_SIDE,
                "mean": [0.5, 0.5, 0.5],
                "std": [0.25, 0.25, 0.25],
            },
            "b_max": 4,
        }
        headers = {"X-Hapi-Request": "extract", "X-Auth-Token": token}
        got = extract(f"{storage_url}/data/shard-0.tar", body, headers)
        assert got.status == 200, got.body
        assert got.headers["x-hapi-execution"] == "decoupled"
        assert got.labels() == labels
        assert got.end is not None and got.end.samples == len(images)
    finally:
        down(stack.config)
