"""One bounded pool of threads that decodes the images of every request, first come first served.

A request's job hands the decode of its next COS batch to the pool, one task per image, and
runs the head of the batch it holds meanwhile (:mod:`hapi_core.engine`): decode and compute
overlap, and the decode spreads over the pool's threads. Tasks run in the order they were
submitted, whoever submitted them, so requests running together share the threads in the
scheduler's order rather than by who submits most. The pool counts each job's queued and
running tasks, so that a cancelled job can be shown to leave nothing behind.

In the Swift proxy ``threading`` is eventlet's green version; decode needs real threads (the
proxy's hub must never run a decode), so the pool takes the original module there.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import types
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

__all__ = ["DecodePool", "DecodeTask", "available_cores", "split_threads"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def available_cores() -> int:
    """The cores this process may run on (its affinity, which a container's cpuset limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def split_threads(
    cores: int, decode_threads: int | None, torch_threads: int | None, *, gpu: bool = False
) -> tuple[int, int]:
    """(decode threads, torch intra-op threads) whose sum never exceeds ``cores``.

    Unset, a GPU host gives decode all cores but one (the head runs on the GPU; torch's CPU
    threads only launch it) and a CPU host one decode thread per 8 cores (none under 8: the
    request's own thread decodes). On a CPU the head's forward is most of an image's CPU time
    (EfficientNet-Lite0 to split 9: 26-46 ms against 2-3 ms of decode per image on one core),
    and every core taken from torch slows it: on 2 cores, 1 decode + 1 torch thread gave 43
    images/s where no decode thread and 2 torch threads gave 61 (issue 30). A set value is
    clamped so that the other keeps at least one core.
    """
    cores = max(1, cores)
    if decode_threads is None:
        if torch_threads is not None:
            decode = cores - torch_threads
        else:
            decode = cores - 1 if gpu else cores // 8
    else:
        decode = min(decode_threads, cores - 1)
    decode = max(0, decode)
    torch_n = cores - decode if torch_threads is None else min(torch_threads, cores - decode)
    return decode, max(1, torch_n)


def _threading() -> types.ModuleType:
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return patcher.original("threading")  # type: ignore[no-any-return]
    return threading


class DecodeTask(Generic[T]):
    """One submitted call; :meth:`result` waits for it (bounded) and re-raises its error."""

    def __init__(self, job: Hashable, fn: Callable[[], T], event: Any) -> None:
        self.job = job
        self.fn: Callable[[], T] | None = fn
        self._done = event
        self._value: T | None = None
        self._error: BaseException | None = None
        self.cancelled = False

    def _run(self) -> None:
        # The call goes once it ran: its closure holds its job (the request's images and
        # model), which the request's release must free, not this task (see _work).
        fn, self.fn = self.fn, None
        assert fn is not None  # a task runs once
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting job
            self._error = exc

    def result(self, timeout: float) -> T:
        if not self._done.wait(timeout):
            raise TimeoutError(f"a decode task did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        if self.cancelled:
            raise RuntimeError("the decode task was cancelled")
        return self._value  # type: ignore[return-value]


class DecodePool:
    """``threads`` workers over one FIFO queue; ``threads=0`` runs each task at submission."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        mod = _threading()
        self._event_type = mod.Event
        self._cond = mod.Condition(mod.Lock())
        self._queue: collections.deque[DecodeTask[Any]] = collections.deque()
        self._queued: collections.Counter[Hashable] = collections.Counter()
        self._running: collections.Counter[Hashable] = collections.Counter()
        self._closed = False
        self._workers = [
            mod.Thread(target=self._work, name=f"hapi-decode-{i}", daemon=True)
            for i in range(threads)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, job: Hashable, fn: Callable[[], T]) -> DecodeTask[T]:
        task: DecodeTask[T] = DecodeTask(job, fn, self._event_type())
        if not self._workers:
            task._run()
            task._done.set()
            return task
        with self._cond:
            if self._closed:
                raise RuntimeError("the decode pool is closed")
            self._queue.append(task)
            self._queued[job] += 1
            self._cond.notify()
        return task

    def pending(self, job: Hashable) -> tuple[int, int]:
        """(queued, running) tasks of ``job``."""
        with self._cond:
            return self._queued[job], self._running[job]

    def cancel(self, job: Hashable, tasks: Iterable[DecodeTask[Any]], timeout: float) -> None:
        """Drop ``job``'s queued ``tasks`` and wait (at most ``timeout``) for its running ones."""
        tasks = list(tasks)
        with self._cond:
            for task in tasks:
                if task in self._queue:
                    self._queue.remove(task)
                    self._queued[job] -= 1
                    task.cancelled = True
                    task._done.set()
        for task in tasks:
            if not task._done.wait(timeout):
                log.warning("a decode task of %s still runs after %s s", job, timeout)
                return

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue:
                    return
                task = self._queue.popleft()
                self._queued[task.job] -= 1
                self._running[task.job] += 1
            task._run()
            # Counted out before the waiter wakes: a job that saw its tasks done finds none left.
            with self._cond:
                self._running[task.job] -= 1
                if not self._running[task.job]:
                    del self._running[task.job]
                if not self._queued[task.job]:
                    del self._queued[task.job]
            task._done.set()
            # Not kept until the next task arrives: its value (a batch of the pil and GPU
            # paths) and its job were a finished request's memory, resident outside the plan;
            # a model evicted for the next request stayed resident, which was refused 507.
            del task
