"""``up``, ``down`` and ``status`` of the local Swift all-in-one stack."""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swiftclient.client import Connection

from hapi_stack._config import ADMIN_USER, OTHER_USER, StackConfig
from hapi_stack._files import prepare_state_dir
from hapi_stack._health import http_client, probe, try_auth
from hapi_stack._paths import StatePaths
from hapi_stack._ports import port_in_use
from hapi_stack._process import is_alive, spawn, stop_processes, tail
from hapi_stack._record import (
    ServiceProcess,
    StackRecord,
    read_record,
    remove_record,
    write_record,
)
from hapi_stack._services import ServiceSpec, stack_services
from hapi_stack.errors import (
    PortInUseError,
    StackError,
    StackNotRunningError,
    StackStartError,
)

__all__ = [
    "RunningStack",
    "ServiceStatus",
    "StackStatus",
    "down",
    "running_stack",
    "status",
    "up",
]

logger = logging.getLogger(__name__)

_POLL_S = 0.1


@dataclass(frozen=True)
class RunningStack:
    """A running stack: where to reach it, who may log in, and the processes it runs.

    Two values compare equal when they describe the same processes; ``started_now`` says whether
    the ``up`` call that returned this value started any of them, ``started`` which.
    """

    config: StackConfig
    services: tuple[ServiceProcess, ...]
    started_now: bool = field(default=False, compare=False)
    started: tuple[str, ...] = field(default=(), compare=False)
    """Names of the services the ``up`` call that returned this value started (all of them on a
    fresh start, only those that were down when it completed a partly stopped stack)."""

    @property
    def proxy_url(self) -> str:
        """Base URL of the Swift proxy as clients call it, e.g. ``http://127.0.0.1:8080``.

        Its host is ``config.public_host`` (the advertised host; never 0.0.0.0).
        """
        return f"http://{self.config.public_host}:{self.config.proxy_port}"

    @property
    def auth_url(self) -> str:
        """The tempauth v1.0 endpoint: GET with ``X-Auth-User``/``X-Auth-Key`` headers."""
        return f"{self.proxy_url}/auth/v1.0"

    @property
    def hapi_url(self) -> str | None:
        """Base URL of the HAPI server, or None when the stack runs without it."""
        if not self.config.hapi_server:
            return None
        return f"http://{self.config.public_host}:{self.config.hapi_port}"

    @property
    def admin_user(self) -> str:
        """``test:tester``, with ``.admin`` on account ``test``."""
        return ADMIN_USER.name

    @property
    def admin_key(self) -> str:
        return ADMIN_USER.key

    @property
    def other_user(self) -> str:
        """``test2:tester2``, without admin rights (for access-control tests)."""
        return OTHER_USER.name

    @property
    def other_key(self) -> str:
        return OTHER_USER.key

    @property
    def pids(self) -> dict[str, int]:
        """Service name to PID."""
        return {service.name: service.pid for service in self.services}

    def account_url(self, account: str) -> str:
        """The storage URL of ``account`` (e.g. ``"test"``, the admin's)."""
        return f"{self.proxy_url}/v1/AUTH_{account}"

    def connection(
        self,
        user: str | None = None,
        key: str | None = None,
        *,
        account: str | None = None,
        **options: Any,
    ) -> Connection:
        """A swiftclient Connection; the admin by default, else ``user`` (key known or given).

        ``account`` makes it address that account instead of the user's own (to use an ACL
        another account granted). ``options`` go to :class:`swiftclient.client.Connection`
        (e.g. ``retries=0``).
        """
        if account is not None:
            options["preauthurl"] = self.account_url(account)
        if user is None:
            user, key = ADMIN_USER.name, ADMIN_USER.key
        elif key is None:
            known = {u.name: u.key for u in (ADMIN_USER, OTHER_USER)}
            if user not in known:
                raise StackError(f"no key known for user {user!r}; pass key=")
            key = known[user]
        return Connection(authurl=self.auth_url, user=user, key=key, auth_version="1", **options)


@dataclass(frozen=True)
class ServiceStatus:
    """One recorded service as seen now."""

    name: str
    pid: int
    port: int
    alive: bool
    healthy: bool
    log_path: Path


@dataclass(frozen=True)
class StackStatus:
    """The recorded services of a state directory (none if nothing is recorded)."""

    state_dir: Path
    services: tuple[ServiceStatus, ...]

    @property
    def recorded(self) -> bool:
        return bool(self.services)

    @property
    def running(self) -> bool:
        """True if a stack is recorded and every service is alive and healthy."""
        return self.recorded and all(s.alive and s.healthy for s in self.services)


@contextmanager
def _locked(paths: StatePaths) -> Iterator[None]:
    # Two `up`s on one state dir at once would start two sets of servers.
    with paths.lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _all_alive(record: StackRecord) -> bool:
    return bool(record.services) and all(is_alive(s.process) for s in record.services)


def _stop(record: StackRecord, timeout: float) -> list[str]:
    by_pid = {s.pid: s.name for s in record.services}
    try:
        stopped = stop_processes([s.process for s in reversed(record.services)], timeout)
    except OSError as exc:
        raise StackError(f"could not stop the stack in {record.config.state_dir}: {exc}") from exc
    return [by_pid[p.pid] for p in stopped]


def _failure(service: ServiceProcess, reason: str) -> StackStartError:
    return StackStartError(
        f"{service.name} (pid {service.pid}, port {service.port})",
        f"{reason} (log: {service.log_path})",
        tail(service.log_path),
    )


def _wait_ready(record: StackRecord, timeout: float) -> None:
    """Wait until every service answers and the admin can log in; StackStartError if not."""
    config = record.config
    deadline = time.monotonic() + timeout
    pending = list(record.services)
    with http_client() as client:
        while pending:
            for service in list(pending):
                if not is_alive(service.process):
                    raise _failure(service, "exited while starting")
                if probe(client, config.local_host, service.port, service.health_url):
                    pending.remove(service)
            if pending and time.monotonic() > deadline:
                raise _failure(pending[0], f"did not become healthy within {timeout:g} s")
            if pending:
                time.sleep(_POLL_S)
        auth_url = f"http://{config.local_host}:{config.proxy_port}/auth/v1.0"
        proxy = next(s for s in record.services if s.name == "proxy")
        while (problem := try_auth(client, auth_url, ADMIN_USER)) is not None:
            if time.monotonic() > deadline:
                raise _failure(proxy, f"does not authenticate the admin: {problem}")
            time.sleep(_POLL_S)


def _check_ports(config: StackConfig) -> None:
    for setting in config.active_port_settings():
        port, host = getattr(config, setting), config.bind_host(setting)
        if port_in_use(host, port):
            raise PortInUseError(host, port, setting)


def _refuse_other_settings(existing: StackRecord, config: StackConfig, root: Path) -> None:
    running, wanted = existing.config.shape(), config.shape()
    if running != wanted:
        changes = ", ".join(
            f"{key} {running[key]!r} (asked {wanted[key]!r})"
            for key in running
            if running[key] != wanted.get(key)
        )
        raise StackError(
            f"a stack with other settings already runs in {root}: {changes}; "
            "stop it first (`hapi stack down`)"
        )


def _spawn(spec: ServiceSpec, paths: StatePaths) -> ServiceProcess:
    log_path = paths.log(spec.name)
    proc = spawn(spec.argv, {**os.environ, **spec.env}, log_path)
    return ServiceProcess(
        name=spec.name,
        pid=proc.pid,
        start_time=proc.start_time,
        port=spec.port,
        health_url=spec.health_url,
        log_path=log_path,
    )


def _start_all(config: StackConfig, paths: StatePaths) -> StackRecord:
    specs = stack_services(config)
    _check_ports(config)
    prepare_state_dir(config)
    record = StackRecord(config=config)
    try:
        for spec in specs:
            record.services.append(_spawn(spec, paths))
            # Recorded at once: if this process dies mid-start, `down` still finds them.
            write_record(paths.pids_file, record)
        _wait_ready(record, config.start_timeout)
    except BaseException:
        try:
            _stop(record, config.stop_timeout)
        except StackError as cleanup_error:
            # Keep pids.json so that `down` can try again; the first error is the story.
            logger.error("cleaning up after a failed start: %s", cleanup_error)
        else:
            remove_record(paths.pids_file)
        raise
    return record


def _start_missing(existing: StackRecord, config: StackConfig, paths: StatePaths) -> list[str]:
    """Start the services of ``existing`` that are down, in start order; leave the others alone.

    Restarting a live service would cost its state: memcached holds every tempauth token, and the
    HAPI server its loaded models. Returns the names started. On failure it stops only what it
    started and puts the previous record back, so the stack is as partly down as before.
    """
    live = {s.name: s for s in existing.services if is_alive(s.process)}
    specs = stack_services(existing.config)
    missing = [spec for spec in specs if spec.name not in live]
    for spec in missing:
        setting = next(s for s in config.active_port_settings() if getattr(config, s) == spec.port)
        if port_in_use(config.bind_host(setting), spec.port):
            raise PortInUseError(config.bind_host(setting), spec.port, setting)
    prepare_state_dir(existing.config)  # same settings: same files, rings kept
    record = existing.model_copy(deep=True)
    current = dict(live)
    started: list[ServiceProcess] = []
    try:
        for spec in missing:
            current[spec.name] = service = _spawn(spec, paths)
            started.append(service)
            # Recorded at once, in start order, dead entries replaced: `down` stops these PIDs.
            record.services = [current[s.name] for s in specs if s.name in current]
            write_record(paths.pids_file, record)
        _wait_ready(record, config.start_timeout)
    except BaseException:
        try:
            stop_processes([s.process for s in reversed(started)], config.stop_timeout)
        except OSError as cleanup_error:
            logger.error("cleaning up after a failed restart: %s", cleanup_error)
            # Keep the new PIDs recorded so that `down` can try again.
        else:
            write_record(paths.pids_file, existing)
        raise
    return [spec.name for spec in missing]


def up(config: StackConfig) -> RunningStack:
    """Start the stack described by ``config``, or return it if it already runs.

    Writes configs and rings under ``config.state_dir``, starts memcached, the Swift account,
    container, object and proxy servers (and the HAPI server if asked), records them in
    ``pids.json`` and waits until all answer and the admin can log in. On failure it stops what
    it started and raises StackStartError with the tail of the failing service's log.

    On a partly stopped stack (some recorded service died or was killed) it starts only the
    services that are down and keeps the others running: this is the recovery path after a
    crash. ``RunningStack.started`` names what it started.

    With ``config.host`` 0.0.0.0 and no ``advertise_host``, the advertised host is chosen
    first (:func:`~hapi_stack.default_advertise_host`) and recorded with the config.

    Raises MissingBinaryError, PortInUseError (before starting anything), StackStartError, or
    StackError when a stack with different settings (even partly) runs in the state directory.
    """
    paths = StatePaths.of(config.state_dir)
    try:
        config = config.advertised()
    except ValueError as exc:
        raise StackError(str(exc)) from exc
    config = config.model_copy(update={"state_dir": paths.root})
    paths.root.mkdir(parents=True, exist_ok=True)
    with _locked(paths):
        existing = read_record(paths.pids_file)
        if existing is not None and any(is_alive(s.process) for s in existing.services):
            _refuse_other_settings(existing, config, paths.root)
            if _all_alive(existing):
                _wait_ready(existing, config.start_timeout)
                logger.info("stack in %s already running", paths.root)
                return RunningStack(existing.config, tuple(existing.services), started_now=False)
            started = _start_missing(existing, config, paths)
            record = read_record(paths.pids_file)
            assert record is not None  # written by _start_missing under the lock
            logger.info("stack in %s was partly down; started %s", paths.root, ", ".join(started))
            return RunningStack(
                record.config, tuple(record.services), started_now=True, started=tuple(started)
            )
        if existing is not None:
            logger.warning("nothing recorded in %s still runs; starting the stack", paths.root)
            remove_record(paths.pids_file)
        record = _start_all(config, paths)
    names = tuple(s.name for s in record.services)
    logger.info("stack started in %s: %s", paths.root, ", ".join(names))
    return RunningStack(config, tuple(record.services), started_now=True, started=names)


def down(config: StackConfig) -> list[str]:
    """Stop the processes recorded in ``config.state_dir``; returns the names of those stopped.

    Each recorded PID is signalled only if its start time still matches, so a recycled PID is
    never touched: SIGTERM, then SIGKILL after ``config.stop_timeout``. Removes ``pids.json``.
    Does nothing when nothing is recorded.
    """
    paths = StatePaths.of(config.state_dir)
    if not paths.pids_file.exists():
        return []
    with _locked(paths):
        record = read_record(paths.pids_file)
        if record is None:
            return []
        stopped = _stop(record, config.stop_timeout)
        remove_record(paths.pids_file)
    logger.info("stack in %s stopped: %s", paths.root, ", ".join(stopped) or "nothing was running")
    return stopped


def status(config: StackConfig) -> StackStatus:
    """Liveness and health of every service recorded in ``config.state_dir``."""
    paths = StatePaths.of(config.state_dir)
    record = read_record(paths.pids_file)
    if record is None:
        return StackStatus(paths.root, ())
    services = []
    with http_client() as client:
        for service in record.services:
            alive = is_alive(service.process)
            healthy = alive and probe(
                client, record.config.local_host, service.port, service.health_url
            )
            services.append(
                ServiceStatus(
                    service.name, service.pid, service.port, alive, healthy, service.log_path
                )
            )
    return StackStatus(paths.root, tuple(services))


def running_stack(config: StackConfig) -> RunningStack:
    """The stack recorded in ``config.state_dir`` if all its processes run (no health probe).

    For commands that need the URLs and credentials of a stack started earlier.
    Raises StackNotRunningError otherwise.
    """
    paths = StatePaths.of(config.state_dir)
    record = read_record(paths.pids_file)
    if record is None or not _all_alive(record):
        raise StackNotRunningError(
            f"no running stack in {paths.root}; start one with `hapi stack up`"
        )
    return RunningStack(record.config, tuple(record.services))
