"""Against the session's real Swift stack (see tests/conftest.py)."""

from __future__ import annotations

import uuid

import httpx
import pytest
from swiftclient.client import ClientException, Connection

from hapi_stack import RunningStack, status, up


def _container() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


def test_every_service_is_alive_and_healthy(swift_stack: RunningStack) -> None:
    report = status(swift_stack.config)
    assert report.running
    assert [s.name for s in report.services] == [
        "memcached",
        "account",
        "container",
        "object",
        "proxy",
    ]
    assert {s.name: s.pid for s in report.services} == swift_stack.pids
    assert all(s.alive and s.healthy for s in report.services)
    assert swift_stack.hapi_url is None


def test_second_up_starts_nothing(swift_stack: RunningStack) -> None:
    record = (swift_stack.config.state_dir / "pids.json").read_text()
    again = up(swift_stack.config)
    assert again == swift_stack
    assert again.pids == swift_stack.pids
    assert not again.started_now
    assert (swift_stack.config.state_dir / "pids.json").read_text() == record


def test_admin_can_put_and_get_an_object(swift_conn: Connection) -> None:
    container = _container()
    swift_conn.put_container(container)
    swift_conn.put_object(container, "hello.txt", b"hello swift")
    headers, body = swift_conn.get_object(container, "hello.txt")
    assert body == b"hello swift"
    assert headers["content-length"] == "11"


def test_other_user_needs_a_read_acl(swift_stack: RunningStack, swift_conn: Connection) -> None:
    container = _container()
    swift_conn.put_container(container)
    swift_conn.put_object(container, "secret", b"data")
    # The other user, addressing the admin's account "test" rather than its own.
    other = swift_stack.connection(swift_stack.other_user, account="test", retries=0)
    assert other.get_auth()[0] == swift_conn.get_auth()[0]
    with pytest.raises(ClientException) as denied:
        other.get_object(container, "secret")
    assert denied.value.http_status == 403

    swift_conn.post_container(container, {"X-Container-Read": "test2:tester2"})
    _, body = other.get_object(container, "secret")
    assert body == b"data"
    other.close()


def test_other_user_is_not_admin_of_its_own_account(other_conn: Connection) -> None:
    # Without .admin, tempauth grants nothing by default, not even its own account listing.
    with pytest.raises(ClientException) as denied:
        other_conn.get_account()
    assert denied.value.http_status == 403


def test_wrong_password_is_rejected(swift_stack: RunningStack) -> None:
    headers = {"X-Auth-User": swift_stack.admin_user, "X-Auth-Key": "wrong"}
    with httpx.Client(trust_env=False) as client:
        assert client.get(swift_stack.auth_url, headers=headers).status_code == 401
    conn = swift_stack.connection(swift_stack.admin_user, "wrong", retries=0)
    with pytest.raises(ClientException) as rejected:
        conn.get_account()
    assert rejected.value.http_status == 401
    conn.close()
