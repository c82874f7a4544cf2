from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from hapi_stack import (
    ADMIN_USER,
    OTHER_USER,
    PORT_SETTINGS,
    MissingBinaryError,
    StackConfig,
    port_in_use,
    stack_services,
)


def test_defaults_are_the_documented_ones() -> None:
    config = StackConfig()
    assert config.state_dir == Path(".hapi")
    assert config.host == "127.0.0.1"
    assert (config.proxy_port, config.object_port, config.container_port) == (8080, 6200, 6201)
    assert (config.account_port, config.memcached_port, config.hapi_port) == (6202, 11211, 8090)
    assert config.hapi_server is False
    assert config.proxy_extra_pipeline == []


def test_users_are_the_saio_admin_and_a_non_admin() -> None:
    assert (ADMIN_USER.name, ADMIN_USER.key, ADMIN_USER.groups) == (
        "test:tester",
        "testing",
        (".admin",),
    )
    assert (OTHER_USER.name, OTHER_USER.key, OTHER_USER.groups) == ("test2:tester2", "testing2", ())
    assert OTHER_USER.account == "test2"


def test_duplicate_ports_are_refused() -> None:
    with pytest.raises(ValidationError, match="proxy_port and object_port are both 7000"):
        StackConfig(proxy_port=7000, object_port=7000)


def test_hapi_port_only_counts_when_the_hapi_server_runs() -> None:
    StackConfig(hapi_port=8080)  # unused without the server
    with pytest.raises(ValidationError, match="ports must differ"):
        StackConfig(hapi_port=8080, hapi_server=True)


@pytest.mark.parametrize("host", ["localhost", "::1", "300.1.1.1"])
def test_host_must_be_an_ipv4_address(host: str) -> None:
    with pytest.raises(ValidationError):
        StackConfig(host=host)


def test_extra_pipeline_names_must_be_words() -> None:
    assert StackConfig(proxy_extra_pipeline=["hapi"]).proxy_extra_pipeline == ["hapi"]
    with pytest.raises(ValidationError, match="single words"):
        StackConfig(proxy_extra_pipeline=["hapi other"])


def test_on_free_ports_picks_distinct_free_ports(tmp_path: Path) -> None:
    config = StackConfig.on_free_ports(state_dir=tmp_path, hapi_server=True)
    ports = [getattr(config, s) for s in PORT_SETTINGS]
    assert len(set(ports)) == len(PORT_SETTINGS)
    assert 8080 not in ports
    assert not any(port_in_use(config.host, p) for p in ports)
    assert config.state_dir == tmp_path and config.hapi_server


def test_shape_ignores_timeouts_and_resolves_the_state_dir(tmp_path: Path) -> None:
    a = StackConfig(state_dir=tmp_path, start_timeout=5)
    b = StackConfig(state_dir=tmp_path / "x" / "..", start_timeout=50)
    assert a.shape() == b.shape()
    assert a.shape() != StackConfig(state_dir=tmp_path, proxy_port=9000).shape()


def test_services_in_start_order_without_hapi_server(tmp_path: Path) -> None:
    services = stack_services(StackConfig(state_dir=tmp_path))
    assert [s.name for s in services] == ["memcached", "account", "container", "object", "proxy"]
    proxy = services[-1]
    assert proxy.health_url == "http://127.0.0.1:8080/healthcheck"
    assert proxy.argv[1:] == (str(tmp_path / "etc" / "proxy-server.conf"), "-v")
    assert Path(proxy.argv[0]).name == "swift-proxy-server"
    memcached = services[0]
    assert memcached.argv[1:5] == ("-l", "127.0.0.1", "-p", "11211")
    assert memcached.health_url is None


def test_hapi_server_is_one_more_service(tmp_path: Path) -> None:
    config = StackConfig(state_dir=tmp_path, hapi_server=True, hapi_port=9999, proxy_port=9998)
    hapi = stack_services(config)[-1]
    assert hapi.name == "hapi-server"
    assert hapi.argv == (sys.executable, "-m", "hapi_server")
    assert hapi.port == 9999
    assert hapi.health_url == "http://127.0.0.1:9999/healthz"
    assert hapi.env["HAPI_PORT"] == "9999"
    assert hapi.env["HAPI_HOST"] == "127.0.0.1"
    assert hapi.env["HAPI_SWIFT_URL"] == "http://127.0.0.1:9998"


def test_missing_memcached_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingBinaryError, match="apt-get install memcached"):
        stack_services(StackConfig(state_dir=tmp_path))


def test_missing_swift_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr("hapi_stack._paths.script_dirs", lambda: (tmp_path,))
    with pytest.raises(MissingBinaryError, match="swift-account-server.*pip install swift"):
        stack_services(StackConfig(state_dir=tmp_path))
