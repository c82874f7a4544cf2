from __future__ import annotations

import configparser
from pathlib import Path

from hapi_stack import StackConfig, render_proxy_conf


def _parse(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    return parser


def test_proxy_conf_has_auth_cache_and_users(tmp_path: Path) -> None:
    config = StackConfig(state_dir=tmp_path, proxy_port=9100, memcached_port=9101)
    conf = _parse(render_proxy_conf(config))
    assert conf["DEFAULT"]["bind_port"] == "9100"
    assert conf["DEFAULT"]["workers"] == "0"
    assert conf["DEFAULT"]["swift_dir"] == str(tmp_path / "etc")
    assert conf["filter:cache"]["memcache_servers"] == "127.0.0.1:9101"
    assert conf["filter:tempauth"]["user_test_tester"] == "testing .admin"
    assert conf["filter:tempauth"]["user_test2_tester2"] == "testing2"
    assert conf["app:proxy-server"]["account_autocreate"] == "true"
    pipeline = conf["pipeline:main"]["pipeline"].split()
    assert pipeline[-1] == "proxy-server"
    for name in pipeline[:-1]:
        assert conf.has_section(f"filter:{name}"), name


def test_extra_filters_go_right_after_tempauth(tmp_path: Path) -> None:
    config = StackConfig(
        state_dir=tmp_path,
        proxy_extra_pipeline=["hapi", "other"],
        proxy_extra_filters={
            "hapi": {"paste.filter_factory": "swift_middleware.middleware:filter_factory"},
            "other": {"use": "egg:swift#name_check"},
        },
    )
    conf = _parse(render_proxy_conf(config))
    pipeline = conf["pipeline:main"]["pipeline"].split()
    at = pipeline.index("tempauth")
    assert pipeline[at + 1 : at + 3] == ["hapi", "other"]
    assert conf["filter:hapi"]["paste.filter_factory"] == (
        "swift_middleware.middleware:filter_factory"
    )
    assert conf["filter:other"]["use"] == "egg:swift#name_check"
