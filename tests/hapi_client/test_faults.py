"""Faults mid-epoch against a real stack: kill a service, restart it with `hapi stack up`.

The module runs its own stack (Swift, memcached and the HAPI server) in a temporary state
directory, because it SIGKILLs services: the session's shared stack stays untouched. For each of
the HAPI server, the object server, the proxy and memcached, a fine-tuning run streams features
from the stack; right after the second shard of the epoch is delivered a hook SIGKILLs the service
by the PID in ``pids.json``; as soon as the client reports its first retry, a second thread runs
:func:`hapi_stack.up` (what ``hapi stack up`` calls), which starts only what is down. The run must
complete with every shard, hence every sample, delivered exactly once, and train exactly the
weights of a run without faults. Without a restart, the run must fail with a typed error once
its (short, here) retry budget is spent.

Synchronisation is by events (the delivery hook, the client's ``on_retry`` callback, ``waitpid``);
nothing sleeps and nothing is timed against a threshold. The recovery times (kill to the first
shard delivered by a request sent after the kill) are printed: ``pytest -s -k faults``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import hapi_models
import pytest
import torch
from swiftclient.client import ClientException

from hapi_client import (
    FinetuneResult,
    HapiClient,
    OptimizerConfig,
    RetryPolicy,
    ServerUnavailableError,
    StoredModel,
    SwiftCredentials,
    SwiftSession,
    SwiftUnavailableError,
    upload_model,
)
from hapi_client.datasets import get_source, upload_dataset
from hapi_client.options import ExtractOptions, TrainOptions
from hapi_client.retry import RetryEvent
from hapi_contract import ExtractRequest
from hapi_stack import RunningStack, StackConfig, StackError, down, running_stack, up

pytestmark = [pytest.mark.swift, pytest.mark.slow]

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
OPT = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
KILL_AFTER = 2  # shards delivered before the kill: mid-epoch, with most of the epoch to go
# The stack's HAPI server, as the other client tests run theirs: one torch thread, small batches.
SERVER_ENV = {
    "HAPI_TORCH_THREADS": "1",
    "HAPI_ADAPTATION_WINDOW_S": "0.01",
    "HAPI_B_MIN": "4",
    "HAPI_CPU_MEMORY_BUDGET_BYTES": str(3 * 2**30),
    # No layout pinned: a restarted server reads each head's layout choice from the session's
    # HAPI_CACHE_DIR (hapi_models.layout) instead of timing itself into the other one, whose
    # features a few ulps apart training would amplify past the weights' tolerance below.
}
# A short budget for the faults nobody repairs, so that the failure comes quickly.
SHORT_BUDGET_S = 2.0


@dataclass
class FaultEnv:
    config: StackConfig
    stack: RunningStack
    credentials: SwiftCredentials
    model: StoredModel
    container: str
    shards: list[str]
    num_samples: int
    reference: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Fault:
    """What happened around one kill, filled in by the hooks (under ``lock``)."""

    service: str | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    delivered: list[str] = field(default_factory=list)
    killed_at: float | None = None
    retried_at: float | None = None
    progress_at: float | None = None
    restarted: tuple[str, ...] = ()
    restart_s: float | None = None
    restart_error: BaseException | None = None


@pytest.fixture(scope="module")
def fault_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultEnv]:
    with pytest.MonkeyPatch.context() as patch:
        # Restarts spawn the HAPI server from this process's environment: keep it set throughout.
        for name, value in SERVER_ENV.items():
            patch.setenv(name, value)
        config = StackConfig.on_free_ports(
            state_dir=tmp_path_factory.mktemp("fault-stack"), hapi_server=True
        )
        try:
            stack = up(config)
        except StackError as exc:
            pytest.fail(f"cannot start the fault test's stack: {exc}", pytrace=False)
        try:
            conn = stack.connection()
            model, _ = upload_model(conn, "efficientnet_lite0", container="fault-models")
            manifest = upload_dataset(
                conn,
                get_source("photos:train?per_class=8&size=96x72"),
                "fault-train",
                shard_size=4,
                progress=False,
            )
            conn.close()
            creds = SwiftCredentials(stack.auth_url, stack.admin_user, stack.admin_key)
            env = FaultEnv(
                config,
                stack,
                creds,
                model,
                "fault-train",
                [s.name for s in manifest.shards],
                manifest.num_samples,
            )
            reference, fault = _run(env, Fault(None), restart=False)
            assert sorted(fault.delivered) == sorted(env.shards)
            env.reference = reference.model.state_dict()
            yield env
        finally:
            down(config)


def _kill(config: StackConfig, service: str) -> None:
    """SIGKILL ``service`` by the PID recorded in pids.json, and reap it (it is our child)."""
    pid = running_stack(config).pids[service]
    os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # already reaped by hapi_stack's liveness check in another thread


def _run(
    env: FaultEnv, fault: Fault, *, restart: bool, **policy: Any
) -> tuple[FinetuneResult, Fault]:
    """Fine-tune one epoch, killing ``fault.service`` after KILL_AFTER shards (if any)."""
    outage_seen = threading.Event()  # the client retried after the kill, or the run ended

    def on_retry(event: RetryEvent) -> None:
        with fault.lock:
            if fault.killed_at is not None and fault.retried_at is None:
                fault.retried_at = time.monotonic()
                outage_seen.set()

    def restart_when_seen() -> None:
        outage_seen.wait()
        if fault.retried_at is None:
            return  # the run ended without noticing the outage: the test fails on `restarted`
        began = time.monotonic()
        try:
            fault.restarted = up(env.config).started
        except BaseException as exc:  # re-raised in the test's thread
            fault.restart_error = exc
        fault.restart_s = time.monotonic() - began

    client = HapiClient(
        env.stack.hapi_url or "",
        env.credentials,
        retry=RetryPolicy(backoff_s=0.1, max_backoff_s=1.0, on_retry=on_retry, **policy),
    )
    extract = client.transport.extract

    def extract_and_maybe_kill(req: ExtractRequest, num_samples: int | None = None) -> Any:
        sent = time.monotonic()
        got = extract(req, num_samples)  # returns only a verified, complete shard
        with fault.lock:
            fault.delivered.append(req.shard)
            killed = fault.killed_at
            if killed is not None and sent > killed and fault.progress_at is None:
                fault.progress_at = time.monotonic()
            if fault.service and killed is None and len(fault.delivered) == KILL_AFTER:
                _kill(env.config, fault.service)
                fault.killed_at = time.monotonic()
        return got

    client.transport.extract = extract_and_maybe_kill  # type: ignore[method-assign]
    restarter = threading.Thread(target=restart_when_seen, name="restarter")
    if restart:
        restarter.start()
    try:
        with client:
            result = client.finetune(
                model=env.model.name,
                container=env.container,
                train=TrainOptions.with_optimizer(OPT, batch_size=4, seed=3),
                extract=ExtractOptions(split="freeze", cache_features=False),
                transform=SMALL,
                progress=False,
            )
    finally:
        outage_seen.set()
        if restart:
            restarter.join()
    if fault.restart_error is not None:
        raise fault.restart_error
    return result, fault


@pytest.mark.parametrize("service", ["hapi-server", "object", "proxy", "memcached"])
def test_a_service_killed_mid_epoch_and_restarted_loses_and_repeats_nothing(
    fault_env: FaultEnv, service: str
) -> None:
    others = {k: v for k, v in running_stack(fault_env.config).pids.items() if k != service}
    result, fault = _run(fault_env, Fault(service), restart=True)  # the default retry budget

    assert fault.killed_at is not None and fault.retried_at is not None
    assert fault.restarted == (service,)  # `up` started only what was down
    now = running_stack(fault_env.config).pids
    assert {k: v for k, v in now.items() if k != service} == others
    # Every shard exactly once (a shard counts only whole, with its verified end frame), hence
    # every sample exactly once, and the epoch's accounting agrees.
    assert sorted(fault.delivered) == sorted(fault_env.shards)
    assert result.history[0].samples == fault_env.num_samples
    assert result.history[0].iterations == -(-fault_env.num_samples // 4)
    # The same batches in the same order: the same weights as the run without faults (the
    # tolerance of test_hapi_equals_baseline: float sums in another order on the server).
    for key, value in result.model.state_dict().items():
        torch.testing.assert_close(value, fault_env.reference[key], rtol=1e-4, atol=1e-5, msg=key)
    assert fault.progress_at is not None
    print(
        f"\n{service}: killed -> first retry {fault.retried_at - fault.killed_at:.1f} s, "
        f"`up` restarted it in {fault.restart_s:.1f} s, "
        f"run progressing again {fault.progress_at - fault.killed_at:.1f} s after the kill"
    )


@pytest.mark.parametrize("service", ["hapi-server", "memcached"])
def test_a_service_killed_and_not_restarted_fails_loudly_within_the_budget(
    fault_env: FaultEnv, service: str
) -> None:
    try:
        with pytest.raises((ServerUnavailableError, SwiftUnavailableError)) as failed:
            _run(fault_env, Fault(service), restart=False, budget_s=SHORT_BUDGET_S)
    finally:
        started = up(fault_env.config).started  # repair the stack for the next test
    assert started == (service,)
    if service == "memcached":
        # Tokens are checked in memcached: the server's read is refused (401), and the new
        # login's 503 is retried until the budget runs out; the error says what is down.
        assert isinstance(failed.value, SwiftUnavailableError)
        assert (failed.value.endpoint, failed.value.status) == ("auth", 503)
        assert "memcached" in str(failed.value) and "hapi stack up" in str(failed.value)
    else:
        assert isinstance(failed.value, ServerUnavailableError)
        assert failed.value.status is None  # no answer at all: nothing listens
        assert "hapi stack up" in str(failed.value)


def test_an_object_server_outage_does_not_error_limit_the_only_node(
    fault_env: FaultEnv,
) -> None:
    """With Swift's defaults the proxy would skip its only object node for 60 s after more
    than 10 errors; the stack's settings let it use the restarted node at once."""
    shard = fault_env.shards[0]
    conn = fault_env.stack.connection(retries=0)
    _kill(fault_env.config, "object")
    for _ in range(12):  # more than error_suppression_limit (10) errors
        with pytest.raises(ClientException) as refused:
            conn.get_object(fault_env.container, shard)
        assert refused.value.http_status == 503
    conn.close()
    assert up(fault_env.config).started == ("object",)
    # A 10 s budget, a sixth of Swift's default suppression interval: fails with the defaults.
    session = SwiftSession(fault_env.credentials, retry=RetryPolicy(budget_s=10.0))
    data, _ = session.get(fault_env.container, shard)
    assert len(data) > 0
