"""Unit test of ``DecodePool``: a task that ran keeps nothing of its call alive.

A decode task's call closes over its job, which holds the request's images and model; a task
kept by its worker (until the next task) or by the job's bookkeeping kept them resident after
the request ended, where the planner counted them as memory outside the plan and refused the
next request 507 (issue 27).
"""

from __future__ import annotations

import functools
import gc
import weakref

import pytest

from hapi_core.decode_pool import DecodePool


class _Job:
    """Stands in for what a decode call closes over (an ExtractionJob)."""


@pytest.mark.parametrize("threads", [0, 1])
def test_a_task_that_ran_holds_nothing_of_its_call(threads: int) -> None:
    pool = DecodePool(threads)
    try:
        job = _Job()
        gone = weakref.ref(job)
        task = pool.submit("job", functools.partial(isinstance, job, _Job))
        assert task.result(timeout=10) is True
        del job
        gc.collect()
        # The task is still referenced here, as the job's bookkeeping keeps it: its call is not.
        assert gone() is None and task.fn is None
    finally:
        pool.close()
