"""Fail fast, once, with the next step (issue 21, point 1), against the session's real stack.

The preflight refuses in one attempt what a run cannot work without, with one line naming the
command to run; a run whose server goes away for good fails within its retry budget (plus one
attempt), whatever the prefetch depth; the error names the cause that was seen (refused, 5xx,
a cut stream).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
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
    # A bounded read: a server that never answers fails the test instead of hanging it.
    return HapiTransport(url, client.swift, retry=client.retry, timeout_s=30.0)


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
    # The outage's budget was already spent: one attempt, and the outage's own count and time.
    assert "(1 attempt, " in str(second.value)
    assert "in all since the outage began, over" in str(second.value)


#: What the faulty server answers every request with, by mode: a 500, or a 200 whose body stops
#: after 10 of its announced 100000 bytes.
_FAULTS = {
    "5xx": b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
    b"content-length: 38\r\nconnection: close\r\n\r\n"
    b'{"detail": "boom", "code": "internal"}',
    "cut": b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\nconnection: close\r\n\r\n" + b"\0" * 10,
}


class _FaultyServer:
    """Answers each connection's one request with a fault, then closes it.

    Plain sockets, one connection at a time: every step is explicit, so nothing is left
    half-open for a client to wait on (an ``http.server`` version once left an accepted
    connection unread and the client waiting for its read timeout).
    """

    def __init__(self, mode: str) -> None:
        self.answer = _FAULTS[mode]
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            with conn:
                if self.stopping:
                    return
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk
        conn.sendall(self.answer)
        conn.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        # Closing the listener does not wake a thread blocked in accept(): a connection does.
        self.stopping = True
        socket.create_connection(("127.0.0.1", self.port)).close()
        self.thread.join()
        self.listener.close()


@pytest.mark.parametrize(
    ("mode", "cause"),
    [("5xx", "the server answered 500: see its log"), ("cut", "cut mid-stream")],
)
def test_the_error_names_the_cause_that_was_seen(
    client_env: ClientEnv,
    mode: str,
    cause: str,
) -> None:
    server = _FaultyServer(mode)
    transport = _transport(client_env, f"http://127.0.0.1:{server.port}", 0.5)
    try:
        with pytest.raises(ServerUnavailableError) as failed:
            transport.extract(_request(client_env))
    finally:
        transport.close()
        server.stop()
    message = _one_line(failed.value)
    assert cause in message and "likely down" not in message


def test_a_mistyped_container_gets_a_did_you_mean(client_env: ClientEnv) -> None:
    model = client_env.models["efficientnet_lite0"].name
    mistyped = client_env.train.replace("train", "trian")
    with client_env.client() as client, pytest.raises(SwiftAccessError) as refused:
        preflight(client, model=model, containers=[mistyped])
    message = _one_line(refused.value)
    assert f"{mistyped} does not exist" in message
    assert f"did you mean {client_env.train!r}?" in message


def test_images_without_a_manifest_name_hapi_dataset_index(client_env: ClientEnv) -> None:
    conn = client_env.stack.connection()
    container = f"loose-photos-{uuid.uuid4().hex[:8]}"
    conn.put_container(container)
    conn.put_object(container, "train/cat/0001.jpg", b"\xff\xd8\xff not read here")
    conn.close()
    model = client_env.models["efficientnet_lite0"].name
    with client_env.client() as client, pytest.raises(SwiftAccessError) as refused:
        preflight(client, model=model, containers=[container])
    message = _one_line(refused.value)
    assert f"`hapi dataset index --container {container} --layout folder`" in message
    assert "`hapi upload dataset" in message
