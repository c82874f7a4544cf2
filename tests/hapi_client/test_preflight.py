"""Fail fast, once, with the next step (issue 21, point 1), against the session's real stack.

The preflight refuses in one attempt what a run cannot work without, with one line naming the
command to run; a run whose server goes away for good fails within its retry budget (plus one
attempt), whatever the prefetch depth; the error names the cause that was seen (refused, 5xx,
a cut stream).
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import hapi_models
import pytest
import torch

from hapi_client import (
    ConfigurationError,
    HapiClient,
    RetryPolicy,
    ServerUnavailableError,
    SwiftAccessError,
    SwiftUnavailableError,
)
from hapi_client.pipeline import EpochCounters, LoadedShard, iterate_batches, plan_epoch
from hapi_client.preflight import preflight
from hapi_client.transport import HapiTransport
from hapi_contract import ExtractRequest, TransformSpec

from .conftest import ClientEnv

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def test_a_complete_setup_passes_and_says_what_it_checked(client_env: ClientEnv) -> None:
    with client_env.client() as client:
        report = preflight(
            client,
            model=client_env.models["efficientnet_lite0"].name,
            containers=[client_env.train, client_env.test],
        )
    text = "; ".join(report.checked)
    assert client_env.train in text and client_env.test in text and "HAPI server" in text


@pytest.mark.parametrize("which", ["train", "eval"])
def test_a_missing_container_is_one_line_naming_the_upload(
    client_env: ClientEnv, which: str
) -> None:
    model = client_env.models["efficientnet_lite0"].name
    train, held_out = client_env.train, client_env.test
    if which == "train":
        train = "no-such-train"
    else:
        held_out = "no-such-test"
    with client_env.client() as client, pytest.raises(SwiftAccessError) as refused:
        # The recipe checks before anything else: the eval container is not found after an epoch.
        client.finetune(model=model, container=train, eval_container=held_out, progress=False)
    message = _one_line(refused.value)
    assert "does not exist" in message and "`hapi upload dataset" in message
    assert ("no-such-train" if which == "train" else "no-such-test") in message


def test_an_unknown_model_names_hapi_upload_model(client_env: ClientEnv) -> None:
    with client_env.client() as client, pytest.raises(SwiftAccessError) as refused:
        preflight(client, model="client-models/resnet50", containers=[client_env.train])
    message = _one_line(refused.value)
    assert "client-models/resnet50.json: 404" in message
    assert "`hapi upload model --arch resnet50 --container client-models`" in message


def test_a_bad_model_reference_is_a_configuration_error(client_env: ClientEnv) -> None:
    with client_env.client() as client, pytest.raises(ConfigurationError):
        preflight(client, model="resnet50", containers=[client_env.train])


def test_wrong_credentials_are_named(client_env: ClientEnv) -> None:
    creds = replace(client_env.credentials, key="wrong")
    with client_env.client(creds) as client, pytest.raises(SwiftAccessError) as refused:
        preflight(client, model="models/x", containers=[client_env.train])
    assert "rejected the credentials" in _one_line(refused.value)


def test_swift_down_is_one_line_and_no_retry(client_env: ClientEnv) -> None:
    creds = replace(client_env.credentials, auth_url=f"http://127.0.0.1:{_dead_port()}/auth/v1.0")
    # The default 120 s budget: the preflight does not spend it (a hang would time the test out).
    with HapiClient(client_env.server.url, creds) as client:
        with pytest.raises(SwiftUnavailableError) as refused:
            preflight(client, model="models/x", containers=[client_env.train])
    message = _one_line(refused.value)
    assert "nothing listens at" in message and "`hapi stack up`" in message


@pytest.mark.parametrize("mode", ["hapi", "baseline"])
def test_the_server_down_is_one_line_unless_baseline_needs_none(
    client_env: ClientEnv, mode: str
) -> None:
    url = f"http://127.0.0.1:{_dead_port()}"
    model = client_env.models["efficientnet_lite0"].name
    with HapiClient(url, client_env.credentials) as client:
        if mode == "baseline":
            preflight(client, model=model, containers=[client_env.train], mode=mode)
            return
        with pytest.raises(ServerUnavailableError) as refused:
            preflight(client, model=model, containers=[client_env.train], mode=mode)
    message = _one_line(refused.value)
    assert f"nothing listens at {url}" in message and "`hapi stack up`" in message


# -- failures after the start: the budget, and the cause named -----------------------------------


def _request(client_env: ClientEnv, shard: int = 0) -> ExtractRequest:
    stored = client_env.models["efficientnet_lite0"]
    with client_env.client() as client:
        name = client.manifest(client_env.train).shards[shard].name
    return ExtractRequest(
        container=client_env.train,
        shard=name,
        model=stored.ref(),
        split_index=1,
        transform=TransformSpec.model_validate(SMALL),
        b_max=4,
    )


def _transport(client_env: ClientEnv, url: str, budget_s: float) -> HapiTransport:
    client = client_env.client(retry=RetryPolicy(budget_s=budget_s, max_backoff_s=0.5))
    return HapiTransport(url, client.swift, retry=client.retry)


BUDGET_S = 4.0
#: Upper bound of the promise "within the budget plus one attempt": an attempt on a port where
#: nothing listens is refused at once; the rest is scheduling on a loaded machine.
SLACK_S = 2.0


def test_the_run_fails_within_the_budget_even_when_a_failed_shard_is_read_late(
    client_env: ClientEnv,
) -> None:
    """The prefetch must not send a new request once a shard has failed: that request would
    start a fresh budget, and leaving the pool waits for it (the error came after 2x the
    budget). Shard 0 is held back until shard 1 has given up, so the pipeline reads shard 1's
    failure late, with a shard still to send."""
    transport = _transport(client_env, f"http://127.0.0.1:{_dead_port()}", BUDGET_S)
    req = _request(client_env)
    gave_up = threading.Event()
    sent: list[int] = []

    class Recording(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            sent.append(args[0])
            return super().submit(fn, *args, **kwargs)

    def loader(k: int) -> LoadedShard:
        if k == 0:
            gave_up.wait()
            return LoadedShard(torch.zeros(2, 1), torch.zeros(2, dtype=torch.int64), 0, 1)
        try:
            transport.extract(req)
        except ServerUnavailableError:
            gave_up.set()
            raise
        raise AssertionError("nothing listens: the request cannot succeed")

    plan = plan_epoch(5, seed=0, epoch=0, shuffle=False)
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError) as failed:
        with Recording(3) as pool:  # a thread free for a new request
            for _ in iterate_batches(plan, [2] * 5, loader, 2, pool, 2, EpochCounters()):
                pass
    elapsed = time.monotonic() - start
    transport.close()
    assert "nothing listens at" in _one_line(failed.value)
    assert 3 not in sent  # nothing submitted once a failure was there to read
    assert elapsed < BUDGET_S + SLACK_S, f"failed after {elapsed:.1f} s"


def test_a_request_sent_during_an_outage_gets_only_what_is_left_of_the_budget(
    client_env: ClientEnv,
) -> None:
    transport = _transport(client_env, f"http://127.0.0.1:{_dead_port()}", 1.0)
    req = _request(client_env)
    with pytest.raises(ServerUnavailableError):
        transport.extract(req)
    with pytest.raises(ServerUnavailableError) as second:
        transport.extract(req)
    transport.close()
    assert "(1 attempt over" in str(second.value)  # the outage's budget was already spent


class _Faulty(http.server.BaseHTTPRequestHandler):
    """A server that answers 500, or starts a response and closes the connection."""

    mode = "5xx"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.mode == "5xx":
            body = b'{"detail": "boom", "code": "internal"}'
            self.send_response(500)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(200)
            self.send_header("content-length", "100000")
            self.end_headers()
            self.wfile.write(b"\0" * 10)
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def faulty_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Faulty)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.mark.parametrize(
    ("mode", "cause"),
    [("5xx", "the server answered 500: see its log"), ("cut", "cut mid-stream")],
)
def test_the_error_names_the_cause_that_was_seen(
    client_env: ClientEnv,
    faulty_server: http.server.ThreadingHTTPServer,
    mode: str,
    cause: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_Faulty, "mode", mode)
    url = f"http://127.0.0.1:{faulty_server.server_address[1]}"
    transport = _transport(client_env, url, 0.5)
    with pytest.raises(ServerUnavailableError) as failed:
        transport.extract(_request(client_env))
    transport.close()
    message = _one_line(failed.value)
    assert cause in message and "likely down" not in message
