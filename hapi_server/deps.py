"""FastAPI dependencies of the routes: the server's state and the caller's Swift identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from .settings import ServerSettings
from .state import ServerState
from .swift_io import Caller, parse_caller

__all__ = ["CallerDep", "SettingsDep", "StateDep", "caller_of", "settings_of", "state_of"]


def state_of(request: Request) -> ServerState:
    """The :class:`ServerState` the lifespan created."""
    state: ServerState = request.app.state.hapi
    return state


def settings_of(request: Request) -> ServerSettings:
    """The one settings object the app was created with."""
    return state_of(request).settings


def caller_of(
    request: Request,
    x_auth_token: Annotated[
        str | None, Header(description="the caller's Swift token (401 without it)")
    ] = None,
    x_storage_url: Annotated[
        str | None,
        Header(
            description="the caller's Swift storage URL, `HAPI_SWIFT_URL/v1/<account>` or "
            "under one of `HAPI_SWIFT_URL_ALIASES` (422 without it or for another host)"
        ),
    ] = None,
) -> Caller:
    """The caller's Swift identity, from the headers; the server holds none of its own."""
    settings = settings_of(request)
    return parse_caller(
        x_auth_token, x_storage_url, settings.swift_url, aliases=settings.swift_origins
    )


StateDep = Annotated[ServerState, Depends(state_of)]
SettingsDep = Annotated[ServerSettings, Depends(settings_of)]
CallerDep = Annotated[Caller, Depends(caller_of)]
