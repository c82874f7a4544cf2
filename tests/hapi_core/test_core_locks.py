"""The core's locks work between eventlet's pool threads in a process patched as Swift's proxy.

Run in a subprocess: the patch (``eventlet.patcher.monkey_patch(thread=True)``, what
``swift.common.utils.eventlet_monkey_patch`` does) cannot be undone in this one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import eventlet

    eventlet.patcher.monkey_patch(all=False, socket=True, select=True, thread=True)

    import time

    from eventlet import tpool

    from hapi_core.host_memory import HostMemoryProbe
    from hapi_core.estimates import MemoryEstimator
    from hapi_core.forward_turns import ForwardTurns
    from hapi_core.locks import os_lock
    from hapi_core.timing_cache import LayerTimes

    lock = os_lock()
    turns = ForwardTurns(1)
    # Every lock of the core that the proxy's pool threads take is such a lock.
    kinds = {type(lock), type(LayerTimes.empty()._lock), type(MemoryEstimator()._lock),
             type(HostMemoryProbe()._lock), type(turns._lock)}
    assert len(kinds) == 1, kinds


    def contend(rounds):
        done = 0
        for _ in range(rounds):
            with lock:
                done += 1
                time.sleep(0)  # let the other pool threads run into the held lock
        return done


    def take_turns(owner, rounds):
        # A forward pass's turn, as the in-proxy engine takes it from the pool's threads: the
        # waiters block on locks the releasing thread hands over.
        done = 0
        for i in range(rounds):
            with turns.turn(owner, float(i), 60.0):
                done += 1
                time.sleep(0)
        return done


    jobs = [eventlet.spawn(tpool.execute, contend, 5000) for _ in range(4)]
    print(sum(job.wait() for job in jobs))
    jobs = [eventlet.spawn(tpool.execute, take_turns, f"owner-{i % 2}", 500) for i in range(4)]
    print(sum(job.wait() for job in jobs))
    """
)


def test_pool_threads_of_a_patched_process_share_the_cores_locks() -> None:
    # A green lock (what threading.Lock() gives after the patch) fails here with
    # "Cannot switch to a different thread" as soon as two pool threads contend.
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["20000", "2000"], out.stderr[-2000:]
