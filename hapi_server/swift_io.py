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

from .errors import (
    ForbiddenError,
    HapiServerError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    SwiftUnavailableError,
    UnauthorizedError,
)

log = logging.getLogger(__name__)

_ACCOUNT = re.compile(r"^[A-Za-z0-9_.\-]{1,256}$")


@dataclass(frozen=True)
class Caller:
    """Who asks: their Swift token and account URL (checked to be on our Swift)."""

    token: str
    storage_url: str


def parse_caller(token: str | None, storage_url: str | None, swift_url: str) -> Caller:
    if not token:
        raise UnauthorizedError("missing X-Auth-Token: send the Swift token of the caller")
    if not storage_url:
        raise InvalidRequestError("missing X-Storage-Url: send the caller's Swift storage URL")
    base = swift_url.rstrip("/")
    parts = urlsplit(storage_url)
    path = parts.path.rstrip("/")
    origin = f"{parts.scheme}://{parts.netloc}"
    # The server only ever talks to its own Swift: a storage URL elsewhere would make it a proxy
    # to arbitrary hosts (SSRF), so only the account part of the caller's URL is used.
    if origin != base or not path.startswith("/v1/") or path.count("/") != 2:
        raise InvalidRequestError(
            f"X-Storage-Url must be {base}/v1/<account> (this server reads only from its Swift)"
        )
    account = path.split("/")[2]
    if not _ACCOUNT.match(account):
        raise InvalidRequestError("X-Storage-Url has an invalid account name")
    return Caller(token=token, storage_url=f"{base}/v1/{account}")


@dataclass(frozen=True)
class SwiftObject:
    data: bytes
    etag: str


class SwiftReader:
    def __init__(self, swift_url: str, timeout_s: float) -> None:
        self.swift_url = swift_url.rstrip("/")
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), follow_redirects=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _url(self, caller: Caller, container: str, obj: str) -> str:
        return f"{caller.storage_url}/{quote(container, safe='')}/{quote(obj, safe='/')}"

    @staticmethod
    def _raise_for(status: int, what: str) -> None:
        if status == 401:
            raise UnauthorizedError(f"Swift refused the token for {what} (401)")
        if status == 403:
            raise ForbiddenError(f"no read access to {what} (Swift says 403)")
        if status == 404:
            raise NotFoundError(f"{what} not found in Swift (404)")
        if status >= 400:
            raise SwiftUnavailableError(f"Swift answered {status} for {what}")

    async def head(self, caller: Caller, container: str, obj: str) -> str:
        """Authorise a read of the object as the caller; return its etag."""
        what = f"{container}/{obj}"
        try:
            resp = await self._client.head(
                self._url(caller, container, obj), headers={"X-Auth-Token": caller.token}
            )
        except httpx.HTTPError as exc:
            raise SwiftUnavailableError(f"cannot reach Swift at {self.swift_url}: {exc}") from exc
        self._raise_for(resp.status_code, what)
        return resp.headers.get("etag", "").strip('"')

    async def get(self, caller: Caller, container: str, obj: str, *, max_bytes: int) -> SwiftObject:
        what = f"{container}/{obj}"
        try:
            async with self._client.stream(
                "GET", self._url(caller, container, obj), headers={"X-Auth-Token": caller.token}
            ) as resp:
                self._raise_for(resp.status_code, what)
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
                return SwiftObject(bytes(buf), resp.headers.get("etag", "").strip('"'))
        except HapiServerError:
            raise
        except httpx.HTTPError as exc:
            raise SwiftUnavailableError(
                f"cannot read {what} from Swift at {self.swift_url}: {exc}"
            ) from exc

    async def healthy(self) -> bool:
        try:
            resp = await self._client.get(f"{self.swift_url}/healthcheck", timeout=2.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200
