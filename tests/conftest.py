"""Session fixtures shared by the whole suite.

``swift_stack`` starts one real Swift all-in-one (memcached, account, container, object and proxy
servers) on free loopback ports in a temporary state directory, and stops exactly those processes
at the end of the session. Tests that use it (directly or through ``swift_conn``/``other_conn``)
are marked ``swift`` automatically, so ``pytest -m "not swift"`` runs the rest. A missing
memcached or Swift is a test error with the install command, never a silent skip.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from swiftclient.client import Connection

from hapi_stack import RunningStack, StackConfig, StackError, down, shared_host_env, up

# The suite's client, servers, proxies and torchrun jobs share the machine's cores: their torch
# threads sleep instead of spinning while they wait (hapi_stack._threads). Set before any test
# module imports torch, and inherited by every process the suite starts.
os.environ.update(shared_host_env())


#: The longest files (their tests' seconds in a fresh-clone `make test`, --durations), longest
#: first. Only the order depends on it: a file missing here runs after these, slow files first.
LONGEST_FILES = (
    "tests/test_doc_snippets.py",
    "tests/hapi_client/test_transfer_quality.py",
    "tests/hapi_client/distributed/test_dist_resume.py",
    "tests/multinode/test_two_nodes_elastic.py",
    "tests/hapi_client/distributed/test_dist_training.py",
    "tests/multinode/test_two_nodes.py",
    "tests/hapi_client/test_finetune_checkpoint.py",
    "tests/hapi_bench/test_bench_e2e.py",
    "tests/hapi_client/distributed/test_dist_shrink.py",
    "tests/hapi_server/test_server_oom.py",
    "tests/hapi_server/test_extract_http.py",
    "tests/swift_middleware/test_mw_architectures.py",
)


def _longest_files_first(items: list[pytest.Item]) -> None:
    # Under `make test`'s workers (pytest-xdist, a file at a time, handed out in this order) a
    # long file that starts last leaves the other worker idle at the end: the longest files go
    # first, then the other files with a `slow` test, each file's tests in their own order.
    root = Path(__file__).resolve().parent.parent
    rank = {root / name: i for i, name in enumerate(LONGEST_FILES)}
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), item.path not in slow_files))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    swift = pytest.mark.swift
    for item in items:
        if "swift_stack" in getattr(item, "fixturenames", ()):
            item.add_marker(swift)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items:
        import torch  # only when GPU tests were collected: importing torch takes seconds

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="needs CUDA; no GPU on this machine")
            for item in gpu_items:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def model_listing_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One architecture-listing cache for the session: every server this suite starts (they
    inherit the environment) traces each network once between them, and the user's own cache
    is left alone."""
    # The workers of `make test` (pytest-xdist) share one: their base directories are siblings.
    # Entries are written atomically, so two workers computing the same one at once is harmless.
    if "PYTEST_XDIST_WORKER" in os.environ:
        path = tmp_path_factory.getbasetemp().parent / "hapi-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("hapi-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HAPI_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def swift_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """The session's real Swift stack (admin ``test:tester``, other user ``test2:tester2``)."""
    # Free ports, so that a developer's own `hapi stack up` on the defaults never clashes.
    config = StackConfig.on_free_ports(state_dir=tmp_path_factory.mktemp("swift-stack"))
    try:
        stack = up(config)
    except StackError as exc:
        pytest.fail(f"cannot start the local Swift stack: {exc}", pytrace=False)
    try:
        yield stack
    finally:
        down(stack.config)


@pytest.fixture
def swift_conn(swift_stack: RunningStack) -> Iterator[Connection]:
    """A swiftclient Connection as the admin of account ``test``."""
    conn = swift_stack.connection()
    yield conn
    conn.close()


@pytest.fixture
def other_conn(swift_stack: RunningStack) -> Iterator[Connection]:
    """A swiftclient Connection as ``test2:tester2``, who has no rights on account ``test``."""
    conn = swift_stack.connection(swift_stack.other_user, swift_stack.other_key)
    yield conn
    conn.close()


# What /proc says about processes, read independently of hapi_stack's own code.
def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()  # fields 3 (state), 4 (ppid), ...


def _running(pid: int, start_time: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in "ZX" and int(fields[19]) == start_time


def _live_children() -> set[int]:
    children = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == os.getpid() and fields[0] not in "ZX":
                children.add(int(entry.name))
    return children


@pytest.fixture
def no_collector() -> Iterator[None]:
    """Only reference counting frees: what a full collection would free, it may not for long
    (a server found 200 MiB of failed batches still held after their error frames)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def pid_running() -> Callable[[int, int], bool]:
    """``pid_running(pid, start_time)``: that very process exists and is not a zombie."""
    return _running


@pytest.fixture
def live_children() -> Callable[[], set[int]]:
    """``live_children()``: PIDs of this test process's children that are still running."""
    return _live_children
