"""The filter's options as paste hands them over: strings, checked once at proxy start."""

from __future__ import annotations

import pytest

from swift_middleware import Execution, FilterConfig, FilterConfigError


def test_defaults_need_only_the_servers() -> None:
    config = FilterConfig.from_conf({"hapi_servers": "http://127.0.0.1:8090"})
    assert config.execution is Execution.DECOUPLED
    assert config.hapi_servers == ["http://127.0.0.1:8090"]
    assert config.swift_url is None
    assert config.max_body_bytes == 1024 * 1024
    assert (config.health_check_interval, config.conn_timeout, config.node_timeout) == (5, 5, 600)


def test_strings_are_parsed_and_server_lists_split_on_commas_or_spaces() -> None:
    config = FilterConfig.from_conf(
        {
            "hapi_servers": "http://a:8090, http://b:8090  https://c",
            "swift_url": "http://swift:8080/",
            "max_body_bytes": "4096",
            "health_check_interval": "0.5",
            "torch_threads": "",
            "use": "egg:hapi#hapi",
            "log_level": "DEBUG",
            "__name__": "hapi",
        }
    )
    assert config.hapi_servers == ["http://a:8090", "http://b:8090", "https://c"]
    assert config.swift_url == "http://swift:8080"
    assert config.max_body_bytes == 4096 and config.health_check_interval == 0.5
    assert config.torch_threads is None


def test_in_proxy_needs_no_servers() -> None:
    config = FilterConfig.from_conf(
        {"execution": "in_proxy", "device": "cuda:1", "torch_threads": "3"}
    )
    assert config.execution is Execution.IN_PROXY
    assert (config.device, config.torch_threads) == ("cuda:1", 3)


def test_count_process_memory_defaults_on_and_reaches_the_core() -> None:
    """The proxy's own resident memory counts against the budget unless the option says not."""
    default = FilterConfig.from_conf({"execution": "in_proxy"})
    assert default.count_process_memory is True
    assert default.core_settings().count_process_memory is True
    off = FilterConfig.from_conf({"execution": "in_proxy", "count_process_memory": "false"})
    assert off.core_settings().count_process_memory is False


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({}, "hapi_servers is required"),
        ({"hapi_servers": "a:8090"}, "not an http"),
        ({"hapi_servers": "http://a:8090/v1"}, "without a path"),
        ({"hapi_servers": "http://a:80x"}, "bad port"),
        ({"hapi_servers": "http://a, http://a"}, "same server twice"),
        ({"hapi_servers": "http://a", "execution": "inside"}, "execution"),
        ({"hapi_servers": "http://a", "max_body_bytes": "ten"}, "max_body_bytes"),
        ({"hapi_servers": "http://a", "conn_timeout": "0"}, "conn_timeout"),
        ({"hapi_servers": "http://a", "device": "tpu"}, "device must be"),
        ({"hapi_servers": "http://a", "hapi_server": "http://b"}, "hapi_server: Extra inputs"),
    ],
)
def test_bad_options_fail_at_start_with_the_option_named(
    conf: dict[str, str], message: str
) -> None:
    with pytest.raises(FilterConfigError, match=message) as failed:
        FilterConfig.from_conf(conf)
    assert str(failed.value).startswith("[filter:hapi]")
