"""The in-proxy host performs a ``GetMany`` with green threads, one GET subrequest each.

A fake WSGI app stands in for the rest of the proxy pipeline, so the bound on subrequests in
flight, their order and the stop at the first refusal can be counted exactly (the real
pipeline is covered by ``test_mw_in_place.py``, a refusal among reads in flight included).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import eventlet
import pytest
from eventlet.event import Event
from swift.common.swob import Request

from hapi_core import GetMany
from swift_middleware.errors import SwiftDeniedError
from swift_middleware.hapi_request import HapiRequest
from swift_middleware.in_proxy import _ProxyHost

ACCOUNT = "AUTH_test"


class FakePipeline:
    """GET ``/v1/AUTH_test/<container>/<object>``: the path as the body, after ``release``;
    403 for ``refuse``. Counts subrequests in flight."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.release = Event()
        self.in_flight = 0
        self.most = 0
        self.paths: list[str] = []
        self.finished: list[str] = []
        self.interrupted: list[str] = []
        self.users: set[str | None] = set()

    def __call__(self, env: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = env["PATH_INFO"]
        self.paths.append(path)
        self.users.add(env.get("REMOTE_USER"))
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            if path.endswith(f"/{self.refuse}"):
                start_response("403 Forbidden", [("Content-Length", "0")])
                return [b""]
            self.release.wait()
            body = path.encode()
            self.finished.append(path)
            start_response("200 OK", [("Content-Length", str(len(body))), ("Etag", '"e"')])
            return [body]
        except BaseException:
            # GreenletExit is no Exception: Swift's memcached client leaks its connection then.
            self.interrupted.append(path)
            raise
        finally:
            self.in_flight -= 1


def _host(app: FakePipeline) -> _ProxyHost:
    # The caller's identity as tempauth leaves it; make_subrequest carries it to each GET.
    req = Request.blank(
        f"/v1/{ACCOUNT}/index/part.jsonl", method="POST", environ={"REMOTE_USER": "test:tester"}
    )
    hapi = HapiRequest("extract", ACCOUNT, "index", "part.jsonl", {})
    return _ProxyHost(req, hapi, app, time.monotonic() + 60, logging.getLogger("hapi-test"))


def test_subrequests_are_the_callers_in_order_and_at_most_concurrency_at_once() -> None:
    app = FakePipeline()
    names = tuple(f"img/{i}.jpg" for i in range(12))
    reading = eventlet.spawn(_host(app)._get_many, GetMany("images", names, 1000, 3))
    while app.in_flight < 3:
        eventlet.sleep(0)
    for _ in range(10):  # give a fourth every chance to start: none may
        eventlet.sleep(0)
    assert app.in_flight == 3 and len(app.paths) == 3
    app.release.send(None)
    got = reading.wait()
    assert [o.data.decode() for o in got] == [f"/v1/{ACCOUNT}/images/{n}" for n in names]
    assert app.most == 3 and app.users == {"test:tester"}


def test_a_refusal_stops_new_reads_and_is_raised_after_those_in_flight_finish() -> None:
    app = FakePipeline(refuse="img/1.jpg")
    names = tuple(f"img/{i}.jpg" for i in range(40))
    reading = eventlet.spawn(_host(app)._get_many, GetMany("images", names, 1000, 4))
    while f"/v1/{ACCOUNT}/images/img/1.jpg" not in app.paths or app.in_flight < 3:
        eventlet.sleep(0)
    for _ in range(10):  # give a fifth read, or an early answer, every chance: neither may come
        eventlet.sleep(0)
    assert not reading.dead and len(app.paths) == 4
    # The three reads in flight finish (none is killed inside the pipeline), then the refusal.
    app.release.send(None)
    with pytest.raises(SwiftDeniedError, match="images/img/1.jpg") as refused:
        reading.wait()
    assert refused.value.status == 403
    assert app.in_flight == 0 and not app.interrupted
    assert sorted(app.finished) == [f"/v1/{ACCOUNT}/images/img/{i}.jpg" for i in (0, 2, 3)]
    assert len(app.paths) == 4  # and none started after the refusal
