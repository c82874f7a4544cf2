"""How torch's OpenMP threads wait when several processes share the cores of one host.

A local stack runs Swift's proxy (which may host the extraction), the HAPI server and the
fine-tuning client on the same cores. libgomp's default wait policy lets a thread that waits
at the end of a parallel region spin for a while before it sleeps; when the processes together
have more threads than the host has cores, the spinning threads take the cores from the very
threads they wait for. Measured on this project's 2-core machine with a second torch process
busy: EfficientNet-Lite0's forward on one image took 1.49 s with 2 threads and the default
policy, 0.13 s with 2 threads and ``OMP_WAIT_POLICY=PASSIVE``, 0.09 s with 1 thread.

libgomp reads the variable once, when torch is loaded, so it is set in the environment of the
processes the stack starts and by the ``hapi`` command before it imports torch; a value the
user set is kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["SHARED_HOST_THREADS", "shared_host_env"]

#: The OpenMP settings for processes that share a host's cores with other torch processes.
SHARED_HOST_THREADS: Mapping[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}


def shared_host_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The entries of :data:`SHARED_HOST_THREADS` that ``environ`` (default: this process's
    environment) does not set already."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in SHARED_HOST_THREADS.items() if name not in environ}
