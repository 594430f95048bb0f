"""What the API's write routes depend on: the caller behind a bearer token with the scope
the route needs (401/403), on a replica that may write (503 names the leader otherwise)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from federation.controller.base import errors
from federation.controller.controller import Controller
from federation.controller.http.auth import Authenticator, Caller


class Forbidden(errors.ControllerError):
    """A valid token without the scope the route needs (403)."""


def _caller(request: Request, authorization: str | None, scope: str) -> Caller:
    auth: Authenticator = request.app.state.auth
    caller = auth.caller(authorization)
    if caller is None:
        raise errors.ControllerError("401")
    if scope not in caller.scopes and not (scope == "register" and "write" in caller.scopes):
        raise Forbidden(f"token {caller.name!r} lacks the {scope!r} scope")
    request.app.state.controller.check_writable()  # a follower answers 503 with the leader
    return caller


def writer(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    return _caller(request, authorization, "write")


def registrar(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    return _caller(request, authorization, "register")


Writer = Annotated[Caller, Depends(writer)]
Registrar = Annotated[Caller, Depends(registrar)]


def controller_of(request: Request) -> Controller:
    controller: Controller = request.app.state.controller
    return controller


Ctl = Annotated[Controller, Depends(controller_of)]
