"""Resume and faults during a sweep, against the real Swift and a real HAPI server with the
feature store at its default bound (issue 32): jobs on the same dataset, model and split share
the server's computations, and a job that stops and resumes mid-epoch, or a server killed and
restarted on its port under several jobs, still gives each job every sample of the epoch once,
in its own order, with the features an uninterrupted job gets."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from hapi_client import FeatureDataset, HapiClient, RetryPolicy
from hapi_client.retry import RetryEvent
from hapi_contract import ExtractRequest, read_shard
from tests.hapi_server.conftest import ServerProcess, start_server
from tests.hapi_server.server_helpers import metric

from .conftest import ClientEnv
from .shared_store import STORE_SETTINGS, start_store_server, store_job

WAIT_S = 120.0  # the bound of every wait on another thread


@dataclass
class StoreEnv:
    """The session's data and models behind this module's server, which a test may replace."""

    env: ClientEnv

    @property
    def server(self) -> ServerProcess:
        return self.env.server


@pytest.fixture(scope="module")
def store(client_env: ClientEnv) -> Iterator[StoreEnv]:
    server = start_store_server(client_env)
    held = StoreEnv(dataclasses.replace(client_env, server=server))
    try:
        yield held
    finally:
        held.server.stop()


@dataclass
class Job:
    """One job of the sweep: each batch's labels and feature sum, the shards it asked for in
    order, and how the server answered each (the end frame's ``shared``: hit, coalesced)."""

    batches: list[tuple[list[int], float]] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)
    shared: dict[str, str | None] = field(default_factory=dict)

    def record(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.batches.append((labels.tolist(), float(features.double().sum())))

    @property
    def labels(self) -> list[list[int]]:
        return [y for y, _ in self.batches]


def _client(env: ClientEnv, job: Job, **retry: Any) -> HapiClient:
    """A job's own client, noting how the server answered each shard (end frame's meta)."""
    client = env.client(retry=RetryPolicy(backoff_s=0.2, max_backoff_s=1.0, **retry))
    extract = client.transport.extract

    def noting(req: ExtractRequest, num_samples: int | None = None) -> Any:
        job.requested.append(req.shard)
        got = extract(req, num_samples)
        job.shared[req.shard] = (got.end.meta or {}).get("shared")
        return got

    client.transport.extract = noting  # type: ignore[method-assign]
    return client


def _dataset(env: ClientEnv, client: HapiClient) -> FeatureDataset:
    # The same data seed in every job: the same shard order, so each job's batches are the
    # others' and a job's delivery can be checked against an uninterrupted one batch by batch.
    return store_job(env, client)


def _manifest_labels(env: ClientEnv) -> Counter[int]:
    labels: Counter[int] = Counter()
    with env.client() as client:
        for shard in client.manifest(env.train).shards:
            data, _ = client.swift.get(env.train, shard.name)
            labels.update(s.label for s in read_shard(data))
    return labels


def _assert_same_epoch(got: Job, whole: Job) -> None:
    """The same batches in the same order, and the same features (float sums in another order
    on the server: a tolerance, not bits)."""
    assert got.labels == whole.labels
    for (_, a), (_, b) in zip(got.batches, whole.batches, strict=True):
        assert a == pytest.approx(b, rel=1e-4)


def test_a_job_stopped_mid_epoch_during_a_sweep_resumes_with_every_sample_once(
    store: StoreEnv,
) -> None:
    """Job A stops after three batches (mid-shard: batches of 8, shards of 10) while job B runs
    on, and resumes from its ``state_dict`` while B is still in its epoch; the shards A asks for
    again come from the store or B's computations, and A's epoch is B's, batch for batch."""
    env = store.env
    a, resumed, b = Job(), Job(), Job()
    a_stopped = threading.Event()

    def run_b() -> None:
        with _client(env, b) as client:
            for features, labels in _dataset(env, client):
                b.record(features, labels)
                if len(b.batches) == 1 and not a_stopped.wait(WAIT_S):
                    raise AssertionError("job A did not stop")

    with ThreadPoolExecutor(1) as pool, _client(env, a) as client_a:
        running_b = pool.submit(run_b)
        first = _dataset(env, client_a)
        for features, labels in first:
            a.record(features, labels)
            if len(a.batches) == 3:
                break
        state = first.state_dict()
        a_stopped.set()  # B goes on while A resumes
        assert (state["epoch"], state["batches_done"]) == (0, 3)
        with _client(env, resumed) as client_r:
            again = _dataset(env, client_r)
            again.load_state_dict(state)
            again.set_epoch(0)  # an epoch loop's call: must not restart the epoch
            for features, labels in again:
                resumed.record(features, labels)
        running_b.result(timeout=WAIT_S)

    whole = sum(len(y) for y in b.labels)
    assert whole == sum(_manifest_labels(env).values())
    # Every sample of the epoch once, in the uninterrupted job's order: A's three batches, then
    # the resumed rest, are B's batches.
    _assert_same_epoch(Job(a.batches + resumed.batches), b)
    assert again.epoch == 1
    # The shard A stopped in had reached A whole before it stopped: the resumed job got it
    # from the server's store or a computation in flight, not computed again.
    stopped_in = resumed.requested[0]
    assert stopped_in in a.shared
    assert resumed.shared[stopped_in] in ("hit", "coalesced"), resumed.shared


def _kill(server: ServerProcess) -> None:
    """SIGKILL the server by its PID, and reap it (it is this process's child)."""
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


def test_jobs_of_a_sweep_recover_from_a_server_killed_and_restarted_on_its_port(
    store: StoreEnv,
) -> None:
    """Two jobs stream the same epoch; once each has a shard, the server is SIGKILLed (shared
    computations in flight die with it), and restarted on the same port, empty store and all,
    only after both jobs have retried. Both must finish with every sample once, in order."""
    env = store.env
    killed = store.server
    port = int(killed.url.rsplit(":", 1)[1])
    jobs = [Job(), Job()]
    retried = [threading.Event() for _ in jobs]
    shared_before_kill: list[float] = []

    def kill() -> None:  # the barrier's action: runs once both jobs hold their first shard
        shared_before_kill.append(
            (metric(killed, "hapi_feature_store_hits_total") or 0.0)
            + (metric(killed, "hapi_feature_store_coalesced_total") or 0.0)
        )
        _kill(killed)

    both_have_a_shard = threading.Barrier(len(jobs), action=kill, timeout=WAIT_S)

    def run(i: int) -> None:
        job = jobs[i]

        def on_retry(event: RetryEvent) -> None:
            if killed.process.returncode is not None:
                retried[i].set()

        first = threading.Lock()  # held for good by the thread of the job's first shard

        with _client(env, job, on_retry=on_retry) as client:
            extract = client.transport.extract

            def first_then_wait(req: ExtractRequest, num_samples: int | None = None) -> Any:
                got = extract(req, num_samples)
                if first.acquire(blocking=False):
                    both_have_a_shard.wait()
                return got

            client.transport.extract = first_then_wait  # type: ignore[method-assign]
            for features, labels in _dataset(env, client):
                job.record(features, labels)

    with ThreadPoolExecutor(len(jobs)) as pool:
        running = [pool.submit(run, i) for i in range(len(jobs))]
        for event in retried:  # each job met the outage before anything listens again
            assert event.wait(WAIT_S), "a job did not retry after the kill"
        store.env = dataclasses.replace(
            env,
            server=start_server(env.stack, env.log_dir, None, port=port, **STORE_SETTINGS),
        )
        for job_done in running:
            job_done.result(timeout=WAIT_S)

    assert killed.process.returncode == -signal.SIGKILL
    assert shared_before_kill[0] >= 1  # the second job's first shard was the first's
    expected = _manifest_labels(env)
    for job in jobs:
        assert Counter(label for y in job.labels for label in y) == expected
        assert sum(len(y) for y in job.labels) == sum(expected.values())
    _assert_same_epoch(jobs[0], jobs[1])
    # The restarted server computed what was left for both jobs together: no shard twice (each
    # job still needed most of the epoch's shards: computed per job, they would be more).
    with env.client() as client:
        shards = len(client.manifest(env.train).shards)
    assert 1 <= (metric(store.server, "hapi_feature_store_misses_total") or 0.0) <= shards
