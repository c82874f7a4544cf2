"""Reading Swift objects as the caller: the server holds no Swift credentials of its own.

httpx's async client is used rather than python-swiftclient (synchronous, built on requests):
the event loop keeps serving other requests while an object streams in, and the size limit is
enforced on the bytes as they arrive rather than after buffering an unbounded body.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import httpx

from hapi_core.admission import check_token
from hapi_core.errors import (
    ForbiddenError,
    HapiCoreError,
    InvalidNameError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    StorageRefusedError,
    StorageUnavailableError,
    UnauthorizedError,
)
from hapi_core.flow import ObjectInfo, StoredObject
from hapi_core.inputs import check_swift_name

log = logging.getLogger(__name__)

_ACCOUNT = re.compile(r"^[A-Za-z0-9_.\-]{1,256}$")


@dataclass(frozen=True)
class Caller:
    """Who asks: their Swift token and account URL (checked to be on our Swift)."""

    token: str
    storage_url: str


def parse_caller(
    token: str | None,
    storage_url: str | None,
    swift_url: str,
    *,
    aliases: tuple[str, ...] = (),
) -> Caller:
    """The caller of a request; ``storage_url`` must be ``swift_url/v1/<account>``.

    ``aliases`` are other base URLs of the same Swift (``HAPI_SWIFT_URL_ALIASES``: the names and
    addresses clients reach it by); a storage URL under one of them is accepted, and the
    server still reads ``swift_url/v1/<account>``.
    """
    token = check_token(token)
    if not storage_url:
        raise InvalidRequestError("missing X-Storage-Url: send the caller's Swift storage URL")
    base = swift_url.rstrip("/")
    parts = urlsplit(storage_url)
    path = parts.path.rstrip("/")
    origin = f"{parts.scheme}://{parts.netloc}".lower()
    origins = {base.lower(), *(a.rstrip("/").lower() for a in aliases)}
    # The server only ever talks to its own Swift: a storage URL elsewhere would make it a proxy
    # to arbitrary hosts (SSRF), so only the account part of the caller's URL is used, and any
    # other origin than this Swift's own names is refused.
    if origin not in origins or not path.startswith("/v1/") or path.count("/") != 2:
        raise InvalidRequestError(
            f"X-Storage-Url must be {base}/v1/<account> (this server reads only from its Swift)"
        )
    account = path.split("/")[2]
    if not _ACCOUNT.match(account):
        raise InvalidRequestError("X-Storage-Url has an invalid account name")
    check_swift_name(account, "X-Storage-Url account")
    return Caller(token=token, storage_url=f"{base}/v1/{account}")


class SwiftReader:
    def __init__(self, swift_url: str, timeout_s: float) -> None:
        self.swift_url = swift_url.rstrip("/")
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), follow_redirects=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _url(self, caller: Caller, container: str, obj: str) -> str:
        """The object's URL, naming exactly ``container``/``obj`` and nothing else.

        Dot segments are refused rather than sent: httpx (like any RFC 3986 client) would
        resolve ``a/../b`` to ``b`` and read an object other than the one the request names.
        Everything else is percent-encoded, so no library rewrites the path on the way.
        """
        check_swift_name(container, "container")
        check_swift_name(obj, "object", segmented=True)
        try:
            path = f"{quote(container, safe='')}/{quote(obj, safe='/')}"
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 name can hold it
            raise InvalidNameError(f"{container}/{obj!r} is not valid UTF-8: {exc}") from exc
        return f"{caller.storage_url}/{path}"

    @staticmethod
    def _raise_for(resp: httpx.Response, what: str) -> None:
        """Swift's refusal as the matching error: its 4xx passed on, 502 only for its 5xx."""
        status = resp.status_code
        if status < 300:
            return
        if status == 401:
            raise UnauthorizedError(f"Swift refused the token for {what} (401)")
        if status == 403:
            raise ForbiddenError(f"no read access to {what} (Swift says 403)")
        if status == 404:
            raise NotFoundError(f"{what} not found in Swift (404)")
        if status == 413:
            raise PayloadTooLargeError(f"Swift refused the read of {what} as too large (413)")
        if 400 <= status < 500:
            headers = (
                {"Retry-After": resp.headers["retry-after"]}
                if "retry-after" in resp.headers
                else None
            )
            raise StorageRefusedError(
                f"Swift answered {status} for {what}", status, headers=headers
            )
        # 5xx, and 1xx/3xx that a GET or HEAD of an object never legitimately gets.
        raise StorageUnavailableError(f"Swift answered {status} for {what}")

    async def head(self, caller: Caller, container: str, obj: str) -> ObjectInfo:
        """Authorise a read of the object as the caller; return its etag and size."""
        what = f"{container}/{obj}"
        url = self._url(caller, container, obj)
        try:
            resp = await self._client.head(url, headers={"X-Auth-Token": caller.token})
        except httpx.HTTPError as exc:
            raise StorageUnavailableError(f"cannot reach Swift at {self.swift_url}: {exc}") from exc
        self._raise_for(resp, what)
        length = resp.headers.get("content-length")
        size = int(length) if length is not None and length.isdigit() else None
        return ObjectInfo(resp.headers.get("etag", "").strip('"'), size)

    async def get(
        self, caller: Caller, container: str, obj: str, *, max_bytes: int, tail: int = 0
    ) -> StoredObject:
        """``container/obj`` read as ``caller``, at most ``max_bytes``; with ``tail``, its last
        ``tail`` bytes only."""
        what = f"{container}/{obj}"
        url = self._url(caller, container, obj)
        headers = {"X-Auth-Token": caller.token}
        if tail > 0:
            headers["Range"] = f"bytes=-{tail}"
        try:
            async with self._client.stream("GET", url, headers=headers) as resp:
                self._raise_for(resp, what)
                length = resp.headers.get("content-length")
                if length is not None and int(length) > max_bytes:
                    raise PayloadTooLargeError(
                        f"{what} is {int(length)} bytes, over the limit of {max_bytes} bytes"
                    )
                buf = bytearray()
                async for chunk in resp.aiter_bytes():
                    buf += chunk
                    if len(buf) > max_bytes:
                        raise PayloadTooLargeError(f"{what} exceeds the limit of {max_bytes} bytes")
                # Handed on as read: bytes(buf) held a 988 MB shard twice (issue 27).
                return StoredObject(buf, resp.headers.get("etag", "").strip('"'))
        except HapiCoreError:
            raise
        except httpx.HTTPError as exc:
            raise StorageUnavailableError(
                f"cannot read {what} from Swift at {self.swift_url}: {exc}"
            ) from exc

    async def healthy(self) -> bool:
        try:
            resp = await self._client.get(f"{self.swift_url}/healthcheck", timeout=2.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200
