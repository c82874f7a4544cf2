"""``read_object`` holds an object once and yields to the proxy's hub while it reads.

A fake WSGI app stands in for the proxy pipeline: it serves its chunks without ever blocking,
as the object server's sockets do when the storage network outpaces the CPU.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import eventlet
import pytest
from swift.common.swob import Request

from hapi_core.errors import RequestTimeoutError, StorageUnavailableError
from swift_middleware.swift_access import read_object

CHUNK = b"x" * 4096


class FastObject:
    """GET: ``chunks`` chunks, with ``length`` as Content-Length (None: no header)."""

    def __init__(self, chunks: int, length: int | None) -> None:
        self.chunks = chunks
        self.length = length
        self.served = 0

    def _body(self) -> Iterator[bytes]:
        for _ in range(self.chunks):
            self.served += 1
            yield CHUNK

    def __call__(self, env: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        headers = [("Etag", '"e"')]
        if self.length is not None:
            headers.append(("Content-Length", str(self.length)))
        start_response("200 OK", headers)
        return self._body()


def _env() -> dict[str, Any]:
    return Request.blank("/v1/AUTH_test/c/o", environ={"REMOTE_USER": "test:tester"}).environ


def test_other_green_threads_run_between_the_chunks_of_a_read() -> None:
    app = FastObject(64, 64 * len(CHUNK))
    seen: list[int] = []

    def bystander() -> None:
        # What a plain GET's green thread does: it runs whenever the hub gets a turn.
        while app.served < app.chunks:
            seen.append(app.served)
            eventlet.sleep(0)

    other = eventlet.spawn(bystander)
    data, etag = read_object(_env(), app, "/v1/AUTH_test/c/o", "c/o", limit=10**9)
    other.wait()
    assert bytes(data) == CHUNK * 64 and etag == "e"
    # The bystander ran while the read was half done, not only before or after it.
    assert any(0 < served < app.chunks for served in seen), seen


@pytest.mark.parametrize("length", [64 * len(CHUNK), None], ids=["content-length", "chunked"])
def test_the_object_is_held_in_one_buffer(length: int | None) -> None:
    data, _ = read_object(_env(), FastObject(64, length), "/v1/AUTH_test/c/o", "c/o", limit=10**9)
    # The buffer the chunks were read into, not a bytes copy of it.
    assert isinstance(data, bytearray) and len(data) == 64 * len(CHUNK)


def test_a_body_shorter_than_its_content_length_is_refused() -> None:
    app = FastObject(3, 4 * len(CHUNK))
    with pytest.raises(StorageUnavailableError, match="after 12288 of its 16384 bytes"):
        read_object(_env(), app, "/v1/AUTH_test/c/o", "c/o", limit=10**9)


def test_a_read_holds_only_the_bytes_that_arrived_not_its_content_length() -> None:
    # Sized from Content-Length up front, the buffer was zeroed whole on the hub before the
    # first chunk (851 ms for 64 MiB in a loaded proxy: every other request waited).
    app = FastObject(2, 64 * 2**20)
    tracemalloc.start()
    try:
        with pytest.raises(StorageUnavailableError, match="after 8192 of its 67108864 bytes"):
            read_object(_env(), app, "/v1/AUTH_test/c/o", "c/o", limit=10**9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak} bytes allocated for 8 KiB that arrived"


def test_a_read_past_its_deadline_stops_between_chunks_with_a_504() -> None:
    app = FastObject(64, 64 * len(CHUNK))
    with pytest.raises(RequestTimeoutError, match="c/o"):
        read_object(
            _env(), app, "/v1/AUTH_test/c/o", "c/o", limit=10**9, deadline=time.monotonic() - 1
        )
    assert app.served == 1  # it stopped at the first chunk past the deadline
