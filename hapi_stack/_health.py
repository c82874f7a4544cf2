"""Readiness probes: a service's health URL, or a TCP connect when it has none."""

from __future__ import annotations

import socket

import httpx

from hapi_stack._config import SwiftUser

__all__ = ["http_client", "probe", "try_auth"]

_PROBE_TIMEOUT_S = 2.0


def http_client() -> httpx.Client:
    """A client for loopback probes; ignores proxy variables, which would hijack 127.0.0.1."""
    return httpx.Client(trust_env=False, timeout=_PROBE_TIMEOUT_S)


def probe(client: httpx.Client, host: str, port: int, health_url: str | None) -> bool:
    """True if the service answers: 200 from ``health_url``, else a TCP connection."""
    if health_url is None:
        try:
            with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S):
                return True
        except OSError:
            return False
    try:
        return client.get(health_url).status_code == 200
    except httpx.HTTPError:
        return False


def try_auth(client: httpx.Client, auth_url: str, user: SwiftUser) -> str | None:
    """None if tempauth hands ``user`` a token, else what went wrong."""
    try:
        response = client.get(auth_url, headers={"X-Auth-User": user.name, "X-Auth-Key": user.key})
    except httpx.HTTPError as exc:
        return f"GET {auth_url} failed: {exc!r}"
    if response.status_code != 200 or not response.headers.get("X-Auth-Token"):
        return f"GET {auth_url} as {user.name} answered {response.status_code}"
    return None
