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

The same processes get glibc's ``malloc.hugetlb=1`` tunable: glibc then asks for transparent
huge pages (``madvise``) on the blocks it maps. A host that runs heads holds its mmap threshold
at 1 MiB (:mod:`hapi_core.host_allocator`), so every activation of a megabyte or more is mapped
fresh and faulted in 4 KiB page by page; with huge pages, 2 MiB at a time. EfficientNet-Lite0's
head to split 9 at batch 32 on one thread of a 2-core AMD EPYC: 20.9 ms per image with the
threshold alone, 10.2 ms with the tunable, 17.4 ms with glibc's defaults (issue 30). glibc reads
tunables when a process starts, so they go in the environment of the processes the stack starts;
a kernel whose transparent huge pages are ``never`` ignores the request.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["HOST_ALLOCATOR", "SHARED_HOST_ENV", "SHARED_HOST_THREADS", "shared_host_env"]

#: The OpenMP settings for processes that share a host's cores with other torch processes.
SHARED_HOST_THREADS: Mapping[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
#: glibc's malloc asking for transparent huge pages on the blocks it maps.
HOST_ALLOCATOR: Mapping[str, str] = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
#: Everything the stack's torch processes get.
SHARED_HOST_ENV: Mapping[str, str] = {**SHARED_HOST_THREADS, **HOST_ALLOCATOR}


def shared_host_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The entries of :data:`SHARED_HOST_ENV` that ``environ`` (default: this process's
    environment) does not set already."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in SHARED_HOST_ENV.items() if name not in environ}
