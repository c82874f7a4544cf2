"""The filter through its real ``filter_factory``, with a recording downstream app and tiny HAPI
servers in threads (unit tests: no Swift here; the integration tests use the real one)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from swift.common.registry import get_swift_info
from swift.common.swob import HTTPForbidden, HTTPNoContent, HTTPOk, Request

from swift_middleware import (
    CONTENT_TYPE_HAPI_REQUEST,
    FilterConfigError,
    HapiMiddleware,
    filter_factory,
)

OBJ = "/v1/AUTH_test/data/shards/shard-000000.tar"
HAPI = {"X-Hapi-Request": "extract", "X-Auth-Token": "AUTH_tk123"}


@dataclass
class Downstream:
    """The rest of the pipeline: records every env, answers HEAD with ``head_status``."""

    head_status: int = 200
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, env: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        self.calls.append(env)
        if env["REQUEST_METHOD"] == "HEAD":
            resp = HTTPOk() if self.head_status == 200 else HTTPForbidden()
            resp.headers.update({"Etag": '"abc"', "X-Downstream": "yes"})
            return resp(env, start_response)
        return HTTPNoContent(headers={"X-Downstream": "yes"})(env, start_response)


@dataclass
class FakeHapi:
    """A HAPI server in a thread: ``/healthz`` answers ``health``; ``/v1/extract`` streams."""

    url: str = ""
    health: int = 200
    extract_status: int = 200
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    release_second_chunk: threading.Event = field(default_factory=threading.Event)


@contextmanager
def fake_hapi(**kwargs: Any) -> Iterator[FakeHapi]:
    state = FakeHapi(**kwargs)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            body = b'{"status": "ok"}'
            self.send_response(state.health)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            data = self.rfile.read(int(self.headers["Content-Length"]))
            state.requests.append((dict(self.headers.items()), data))
            state.paths.append(self.path)
            if state.extract_status != 200:
                body = b'{"detail": "bad split", "code": "invalid_request"}'
                self.send_response(state.extract_status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-hapi-frames")
            self.send_header("X-Hapi-Request-Id", "r1")
            self.send_header("Server", "secret-internal-name")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b"first")
            # The second chunk waits for the test: it proves the first was passed on alone.
            state.release_second_chunk.wait(30)
            self._chunk(b"second")
            self._chunk(b"")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release_second_chunk.set()
        server.shutdown()
        server.server_close()


def make_filter(downstream: Downstream, **conf: str) -> HapiMiddleware:
    conf.setdefault("hapi_servers", "http://127.0.0.1:9")
    mw = filter_factory({}, **conf)(downstream)
    assert isinstance(mw, HapiMiddleware)
    return mw


def call(mw: HapiMiddleware, req: Request) -> tuple[str, dict[str, str], Iterator[bytes]]:
    """Call the filter as WSGI; the body iterator is left for the caller to read."""
    captured: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        captured["status"], captured["headers"] = status, dict(headers)

    body = iter(mw(req.environ, start_response))
    first = next(body, b"")
    return captured["status"], captured["headers"], _prepend(first, body)


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def hapi_post(
    body: object = None, path: str = OBJ, method: str = "POST", **headers: str
) -> Request:
    raw = json.dumps({"split_index": 3} if body is None else body).encode()
    req = Request.blank(path, method=method, headers={**HAPI, **headers}, body=raw)
    req.environ["REMOTE_USER"] = "test,test:tester,AUTH_test"
    req.environ["swift.authorize"] = lambda r: None
    return req


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("GET", OBJ, {}),
        ("HEAD", OBJ, {"Content-Type": CONTENT_TYPE_HAPI_REQUEST}),
        ("PUT", OBJ, {"Content-Type": CONTENT_TYPE_HAPI_REQUEST}),  # storing such a document
        ("POST", OBJ, {"X-Object-Meta-A": "b"}),
        ("POST", OBJ, {"Content-Type": "application/json"}),
        ("GET", "/v1/AUTH_test/data", {}),
        ("GET", "/v1/AUTH_test", {}),
        ("GET", "/info", {}),
        # Swift takes a POST to an account or a container as a metadata update (204), whatever
        # its content type: only an object URL can be a HAPI request by content type.
        ("POST", "/v1/AUTH_test/data", {"Content-Type": CONTENT_TYPE_HAPI_REQUEST}),
        ("POST", "/v1/AUTH_test", {"Content-Type": CONTENT_TYPE_HAPI_REQUEST}),
    ],
)
def test_other_requests_pass_through_untouched(
    method: str, path: str, headers: dict[str, str]
) -> None:
    downstream = Downstream()
    body = b"x" if method == "PUT" else b""
    req = Request.blank(path, method=method, headers=headers, body=body)
    status, got, _ = call(make_filter(downstream), req)
    assert [env is req.environ for env in downstream.calls] == [True]
    assert status.startswith("200" if method == "HEAD" else "204")
    assert got["X-Downstream"] == "yes"


def test_a_hapi_request_is_forwarded_and_streamed_as_it_comes() -> None:
    downstream = Downstream()
    with fake_hapi() as hapi:
        mw = make_filter(downstream, hapi_servers=hapi.url, swift_url="http://swift:8080")
        status, headers, body = call(mw, hapi_post({"split_index": 3, "b_max": 8}))
        assert status == "200 OK"
        assert next(body) == b"first"  # before the fake server may send the rest
        hapi.release_second_chunk.set()
        assert b"".join(body) == b"second"
    assert headers["Content-Type"] == "application/x-hapi-frames"
    assert headers["X-Hapi-Request-Id"] == "r1" and headers["X-Hapi-Execution"] == "decoupled"
    assert "secret-internal-name" not in headers.values()
    # Downstream saw only the authorising HEAD, as the caller, never the POST.
    assert [(e["REQUEST_METHOD"], e["PATH_INFO"]) for e in downstream.calls] == [("HEAD", OBJ)]
    head = downstream.calls[0]
    assert head["REMOTE_USER"] == "test,test:tester,AUTH_test" and "swift.authorize" in head
    assert head["swift.source"] == "HAPI"
    [(sent_headers, sent)] = hapi.requests
    assert json.loads(sent) == {
        "split_index": 3,
        "b_max": 8,
        "container": "data",
        "shard": "shards/shard-000000.tar",
    }
    assert sent_headers["X-Auth-Token"] == "AUTH_tk123"
    assert sent_headers["X-Storage-Url"] == "http://swift:8080/v1/AUTH_test"


def test_a_timings_request_goes_to_the_servers_timings_endpoint() -> None:
    with fake_hapi() as hapi:
        hapi.release_second_chunk.set()
        mw = make_filter(Downstream(), hapi_servers=hapi.url)
        req = hapi_post({"split_index": 3, "samples": 4}, **{"X-Hapi-Request": "timings"})
        status, _, body = call(mw, req)
        b"".join(body)
    assert status == "200 OK"
    assert hapi.paths == ["/v1/timings"]
    [(sent_headers, sent)] = hapi.requests
    assert sent_headers["Accept"] == "application/json"
    assert json.loads(sent)["samples"] == 4


def test_the_storage_url_defaults_to_the_url_the_client_used() -> None:
    with fake_hapi() as hapi:
        hapi.release_second_chunk.set()
        mw = make_filter(Downstream(), hapi_servers=hapi.url)
        req = hapi_post()
        req.environ["HTTP_HOST"] = "proxy.example:8080"
        status, _, body = call(mw, req)
        b"".join(body)
    assert status == "200 OK"
    assert hapi.requests[0][0]["X-Storage-Url"] == "http://proxy.example:8080/v1/AUTH_test"


def test_a_refused_read_is_answered_with_swifts_status_and_nothing_is_forwarded() -> None:
    with fake_hapi() as hapi:
        mw = make_filter(Downstream(head_status=403), hapi_servers=hapi.url)
        status, headers, body = call(mw, hapi_post())
    assert status.startswith("403")
    assert headers["Content-Type"] == "application/json"
    assert json.loads(b"".join(body))["code"] == "forbidden"
    assert hapi.requests == []


def test_hapi_server_errors_are_passed_on() -> None:
    with fake_hapi(extract_status=422) as hapi:
        status, headers, body = call(make_filter(Downstream(), hapi_servers=hapi.url), hapi_post())
        data = b"".join(body)
    assert status.startswith("422")
    assert json.loads(data) == {"detail": "bad split", "code": "invalid_request"}
    assert headers["Content-Length"] == str(len(data))


def test_round_robin_skips_a_server_whose_health_check_fails() -> None:
    with fake_hapi() as a, fake_hapi() as b, fake_hapi(health=503) as sick:
        for server in (a, b, sick):
            server.release_second_chunk.set()
        mw = make_filter(Downstream(), hapi_servers=f"{a.url},{sick.url},{b.url}")
        for _ in range(6):
            status, _, body = call(mw, hapi_post())
            b"".join(body)
            assert status == "200 OK"
    assert (len(a.requests), len(b.requests), len(sick.requests)) == (3, 3, 0)


def test_every_server_down_is_a_503_with_retry_after() -> None:
    with fake_hapi(health=503) as sick:
        mw = make_filter(Downstream(), hapi_servers=f"{sick.url}, http://127.0.0.1:9")
        status, headers, body = call(mw, hapi_post())
        detail = json.loads(b"".join(body))
    assert status.startswith("503")
    assert headers["Retry-After"] == "5"
    assert detail["code"] == "no_hapi_server"
    assert sick.url in detail["detail"] and "/healthz answered 503" in detail["detail"]


@pytest.mark.parametrize(
    ("req", "status", "code"),
    [
        (hapi_post(method="PUT"), 405, "method_not_allowed"),
        (Request.blank(OBJ, method="GET", headers=HAPI), 405, "method_not_allowed"),
        (hapi_post(path="/v1/AUTH_test/data"), 400, "bad_hapi_request"),
        (hapi_post(**{"X-Hapi-Request": "finetune"}), 400, "bad_hapi_request"),
        (hapi_post(Range="bytes=0-10"), 400, "bad_hapi_request"),
        (hapi_post(**{"Content-Type": "text/plain"}), 415, "unsupported_media_type"),
        (hapi_post([1, 2]), 400, "bad_hapi_request"),
        (hapi_post({"container": "other"}), 400, "path_mismatch"),
        (hapi_post({"shard": "shards/x.tar"}), 400, "path_mismatch"),
        (hapi_post("x" * 5000), 413, "too_large"),
        (Request.blank(OBJ, method="POST", headers=HAPI, body=b"{nope"), 400, "bad_hapi_request"),
        (Request.blank(OBJ, method="POST", headers=HAPI, body=b""), 400, "bad_hapi_request"),
    ],
    ids=[
        "put-method",
        "get-with-header",
        "container-url",
        "unknown-op",
        "range",
        "content-type",
        "array",
        "container-mismatch",
        "shard-mismatch",
        "too-large",
        "not-json",
        "empty",
    ],
)
def test_malformed_hapi_requests_get_a_json_4xx_from_the_filter(
    req: Request, status: int, code: str
) -> None:
    downstream = Downstream()
    got_status, headers, body = call(make_filter(downstream, max_body_bytes="4096"), req)
    assert got_status.startswith(str(status))
    assert headers["Content-Type"] == "application/json"
    answer = json.loads(b"".join(body))
    assert answer["code"] == code and answer["detail"]
    assert downstream.calls == []  # nothing was read, nothing reached the object
    if status == 405:
        assert headers["Allow"] == "POST"


def test_the_content_type_alone_marks_a_hapi_post() -> None:
    downstream = Downstream(head_status=403)
    req = Request.blank(
        OBJ, method="POST", headers={"Content-Type": CONTENT_TYPE_HAPI_REQUEST}, body=b"{}"
    )
    status, _, _ = call(make_filter(downstream), req)
    assert status.startswith("403")
    assert [e["REQUEST_METHOD"] for e in downstream.calls] == ["HEAD"]


def test_info_advertises_the_filter() -> None:
    filter_factory({}, hapi_servers="http://127.0.0.1:8090", max_body_bytes="2048")
    info = get_swift_info()["hapi"]
    assert info["execution"] == "decoupled"
    assert info["operations"] == ["extract", "timings"]
    assert info["request_header"] == "X-Hapi-Request"
    assert info["max_body_bytes"] == 2048
    assert "hapi_servers" not in info  # internal addresses only in the admin section
    assert get_swift_info(admin=True)["admin"]["hapi"]["hapi_servers"] == ["http://127.0.0.1:8090"]


# The proxy's [DEFAULT] options as paste hands them over: the whole proxy's, not only ours.
PROXY_DEFAULTS = {"__file__": "/etc/swift/proxy-server.conf", "bind_port": "8080", "workers": "2"}


def test_options_are_global_conf_then_local_conf() -> None:
    app = filter_factory(
        {**PROXY_DEFAULTS, "max_body_bytes": "2048", "node_timeout": "30"},
        hapi_servers="http://127.0.0.1:9",
        node_timeout="45",
    )(Downstream())
    assert isinstance(app, HapiMiddleware)
    # [DEFAULT] supplies what the section leaves out; the section wins where both say.
    assert (app.config.max_body_bytes, app.config.node_timeout) == (2048, 45.0)


def test_an_unknown_option_in_the_filter_section_is_still_refused() -> None:
    with pytest.raises(FilterConfigError, match="max_bdy_bytes"):
        filter_factory(PROXY_DEFAULTS, hapi_servers="http://127.0.0.1:9", max_bdy_bytes="1")


def test_the_filter_logs_through_swifts_logger_with_the_transaction_id() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    mw = make_filter(Downstream(), log_name="proxy-server")
    assert mw.logger.server == "proxy-server"  # Swift's adapter, named as the proxy's log
    handler = Keep()
    mw.logger.logger.addHandler(handler)
    try:
        req = Request.blank(OBJ, method="GET", headers=HAPI)
        req.environ["swift.trans_id"] = "tx0123abc"
        mw.logger.txn_id = "tx0123abc"  # what catch_errors sets for every proxy request
        status, _, _ = call(mw, req)
    finally:
        mw.logger.logger.removeHandler(handler)
        mw.logger.txn_id = None  # thread-local, shared by every Swift logger of the thread
    assert status.startswith("405")
    (record,) = [r for r in records if "refused" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert getattr(record, "txn_id", None) == "tx0123abc"


_IMPORTS_AFTER_BUILD = """
import gc, json, sys
from swift_middleware import filter_factory
filter_factory({}, **json.loads(sys.argv[1]))(lambda env, start_response: [])
found = {m: m in sys.modules for m in ("torch", "torchvision.models",
                                       "hapi_core.extraction", "hapi_core.engine")}
print(json.dumps({**found, "frozen": gc.get_freeze_count() > 0}))
"""


@pytest.mark.parametrize(
    ("options", "loaded"),
    [
        ({"execution": "in_proxy"}, True),
        ({"execution": "decoupled", "hapi_servers": "http://127.0.0.1:9"}, False),
    ],
)
def test_an_in_proxy_filter_imports_the_core_when_built_a_decoupled_one_never(
    options: dict[str, str], loaded: bool
) -> None:
    # Imported on the first request instead, torch's import held the proxy's hub (and the GIL)
    # for seconds: every request of the proxy stalled (in_proxy.py's module doc); and what the
    # imports leave is frozen, out of the cyclic collector's full collections. A fresh
    # interpreter, since this one has imported everything long ago.
    done = subprocess.run(  # noqa: S603 - this interpreter, a fixed script
        [sys.executable, "-c", _IMPORTS_AFTER_BUILD, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == dict.fromkeys(imported, loaded)
