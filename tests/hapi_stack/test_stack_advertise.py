"""A stack bound to 0.0.0.0 serves other hosts (issue 22): it hands out and reads Swift at an
advertised host, accepts the other names of its own Swift, and keeps its unauthenticated
services (memcached, the storage servers) on loopback."""

from __future__ import annotations

import socket
from pathlib import Path

import hapi_models
import pytest

from hapi_client import HapiClient, SwiftCredentials, upload_model
from hapi_client.datasets import get_source, upload_dataset
from hapi_contract import ExtractRequest, TransformSpec
from hapi_core.errors import InvalidRequestError
from hapi_server.settings import ServerSettings
from hapi_server.swift_io import parse_caller
from hapi_stack import (
    ADMIN_USER,
    StackConfig,
    default_advertise_host,
    down,
    proxy_filters,
    render_proxy_conf,
    stack_services,
    up,
)

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
TOKEN = "AUTH_tk0123456789abcdef0123456789abcdef"


def test_a_wildcard_stack_binds_publicly_only_what_clients_call() -> None:
    config = StackConfig.on_free_ports(
        host="0.0.0.0", advertise_host="node0.cluster", hapi_server=True
    )
    assert (config.local_host, config.public_host) == ("127.0.0.1", "node0.cluster")
    specs = {spec.name: spec for spec in stack_services(config)}
    assert specs["memcached"].argv[specs["memcached"].argv.index("-l") + 1] == "127.0.0.1"
    server = specs["hapi-server"].env
    assert server["HAPI_HOST"] == "0.0.0.0"
    assert server["HAPI_SWIFT_URL"] == f"http://node0.cluster:{config.proxy_port}"
    aliases = server["HAPI_SWIFT_URL_ALIASES"].split(",")
    assert f"http://127.0.0.1:{config.proxy_port}" in aliases
    assert f"http://{socket.gethostname()}:{config.proxy_port}" in aliases
    assert not any("0.0.0.0" in a or "node0.cluster" in a for a in aliases)
    _, filters = proxy_filters(config)
    assert filters["hapi"]["swift_url"] == server["HAPI_SWIFT_URL"]
    assert filters["hapi"]["hapi_servers"] == f"http://127.0.0.1:{config.hapi_port}"
    conf = render_proxy_conf(config)
    assert "bind_ip = 0.0.0.0" in conf
    assert f"memcache_servers = 127.0.0.1:{config.memcached_port}" in conf
    assert {config.bind_host(s) for s in ("object_port", "memcached_port")} == {"127.0.0.1"}
    assert {config.bind_host(s) for s in ("proxy_port", "hapi_port")} == {"0.0.0.0"}


def test_a_specific_host_is_advertised_as_itself_unless_told_otherwise() -> None:
    config = StackConfig(host="127.0.0.1")
    assert (config.local_host, config.public_host, config.swift_url_aliases()) == (
        "127.0.0.1",
        "127.0.0.1",
        (),
    )
    config = StackConfig(host="10.0.0.5", advertise_host="node0")
    assert config.public_host == "node0"
    assert config.swift_url_aliases() == ("http://10.0.0.5:8080",)
    assert config.advertised() is config
    wildcard = StackConfig(host="0.0.0.0")
    found = default_advertise_host()
    if found is not None:
        assert wildcard.advertised().advertise_host == found


@pytest.mark.parametrize("value", ["http://node0", "node0:8080", "0.0.0.0", "::1", "a b", ""])
def test_the_advertised_host_must_be_a_name_or_an_ipv4_address(value: str) -> None:
    with pytest.raises(ValueError, match="advertise_host"):
        StackConfig(advertise_host=value)


def test_the_server_accepts_its_swifts_other_names_and_reads_only_its_own() -> None:
    base, aliases = "http://192.0.2.2:8080", ("http://127.0.0.1:8080/", "http://Node0:8080")
    for url in ("http://192.0.2.2:8080", "http://127.0.0.1:8080", "http://node0:8080"):
        caller = parse_caller(TOKEN, f"{url}/v1/AUTH_test", base, aliases=aliases)
        assert caller.storage_url == f"{base}/v1/AUTH_test"  # read from HAPI_SWIFT_URL
    for url in ("http://0.0.0.0:8080", "http://127.0.0.1:8081", "http://evil:8080"):
        with pytest.raises(InvalidRequestError, match="X-Storage-Url must be"):
            parse_caller(TOKEN, f"{url}/v1/AUTH_test", base, aliases=aliases)
    settings = ServerSettings(swift_url=base, swift_url_aliases=" http://a:1, http://b:2/ ")
    assert settings.swift_origins == (base, "http://a:1", "http://b:2")


def _non_loopback_address() -> str | None:
    found = default_advertise_host()
    try:
        socket.inet_aton(found or "")
    except OSError:
        return None
    return found


def _refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return False
    except OSError:
        return True


@pytest.mark.swift
@pytest.mark.slow
def test_a_stack_on_all_interfaces_serves_a_client_through_a_non_loopback_address(
    tmp_path: Path,
) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address (no default route)")
    config = StackConfig.on_free_ports(state_dir=tmp_path, host="0.0.0.0", hapi_server=True)
    stack = up(config)
    try:
        assert stack.config.advertise_host == address
        assert stack.proxy_url == f"http://{address}:{config.proxy_port}"
        assert stack.hapi_url == f"http://{address}:{config.hapi_port}"
        # What authenticates nobody stays on loopback.
        assert _refused(address, config.object_port) and _refused(address, config.memcached_port)
        conn = stack.connection()
        model, _ = upload_model(conn, "efficientnet_lite0", container="models")
        upload_dataset(
            conn, get_source("photos:train?per_class=1&size=48x40"), "data", progress=False
        )
        conn.close()
        local = f"http://127.0.0.1:{config.proxy_port}/auth/v1.0"
        for auth_url, endpoint in (
            (stack.auth_url, stack.hapi_url),  # another host's view: the advertised address
            (local, f"http://127.0.0.1:{config.hapi_port}"),  # this host's: an alias
        ):
            assert endpoint is not None
            creds = SwiftCredentials(auth_url, ADMIN_USER.name, ADMIN_USER.key)
            with HapiClient(endpoint, creds) as client:
                shard = client.manifest("data").shards[0]
                features = client.transport.extract(
                    ExtractRequest(
                        container="data",
                        shard=shard.name,
                        model=model.ref(),
                        split_index=1,
                        transform=TransformSpec.model_validate(SMALL),
                        b_max=4,
                    )
                )
            assert len(features.labels) == shard.samples
    finally:
        down(config)
