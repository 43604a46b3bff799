"""Who is calling: bearer tokens `SCHEDULER_READ_TOKEN` (reads) and `SCHEDULER_ADMIN_TOKEN`
(writes, and reads too), compared in constant time.

- No token configured at all: reads are open (the API binds to loopback by default); writes are
  refused with 403 naming `SCHEDULER_ADMIN_TOKEN`.
- Any token configured: every read needs the read or the admin token (401 otherwise).
- Writes need the admin token: 403 with the read token, 401 without a known token, 403 naming
  the variable when no admin token is configured.

Health, readiness, `/v1/leader`, metrics and the API document need no token. `Caller.kind` is
what write logs record as "who". The web console (`scheduler.console`) signs in with the same
tokens (`token_kind`) and calls these routes with the token its session stands for, so its
reads and writes pass the same checks and leave the same log lines.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from scheduler.api.problems import ApiProblem
from scheduler.settings import Settings

READ_VAR = "SCHEDULER_READ_TOKEN"
ADMIN_VAR = "SCHEDULER_ADMIN_TOKEN"
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="mq-scheduler"'}
# Declares the scheme in the OpenAPI document (the /docs "Authorize" button); the token itself
# is checked by `identify`, which gives the precise 401/403 answers.
_BEARER = HTTPBearer(
    auto_error=False,
    description=f"{READ_VAR} for reads, {ADMIN_VAR} for reads and writes",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: `admin`, `read`, or `anonymous` (no tokens configured)."""

    kind: str
    address: str = ""

    @property
    def who(self) -> str:
        return f"{self.kind}@{self.address}" if self.address else self.kind


def _same(given: str, secret: str) -> bool:
    return hmac.compare_digest(given.encode(), secret.encode())


def identify(request: Request, settings: Settings) -> Caller | None:
    """The caller a request's bearer token names, or None when it names no configured token."""
    address = request.client.host if request.client else ""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    kind = token_kind(token, settings)
    return None if kind is None else Caller(kind, address)


def token_kind(token: str, settings: Settings) -> str | None:
    """`admin`, `read`, or None for a token that is neither configured token (the console's
    sign-in asks this too)."""
    admin, read = settings.admin_token, settings.read_token
    # Both compared every time, so the answer's timing says nothing about which one matched.
    is_admin = admin is not None and _same(token, admin.get_secret_value())
    is_read = read is not None and _same(token, read.get_secret_value())
    if is_admin:
        return "admin"
    if is_read:
        return "read"
    return None


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.backend.settings
    return settings


def reader(request: Request, _: Credentials) -> Caller:
    """Dependency of every read route."""
    settings = _settings(request)
    caller = identify(request, settings)
    if caller is not None:
        return caller
    refusal = read_refusal(request, settings)
    if refusal is not None:
        raise refusal
    return Caller("anonymous", request.client.host if request.client else "")


def read_refusal(request: Request, settings: Settings) -> ApiProblem | None:
    """401 for a read without a configured token while any token is set, else None. Reads
    only the headers: the edge asks it before routing (`scheduler.api.refusals`)."""
    if settings.admin_token is None and settings.read_token is None:
        return None
    if identify(request, settings) is not None:
        return None
    return _unauthorized(request, f"{READ_VAR} or {ADMIN_VAR}")


def admin(request: Request, _: Credentials) -> Caller:
    """Dependency of every route that changes state."""
    settings = _settings(request)
    refusal = write_refusal(request, settings)
    caller = identify(request, settings)
    if refusal is not None or caller is None:
        raise refusal or _unauthorized(request, ADMIN_VAR)
    return caller


def write_refusal(request: Request, settings: Settings) -> ApiProblem | None:
    """Why a write is refused (403 writes disabled, 401 unknown token, 403 read token), or
    None for the admin token. Reads only the headers: the body guard asks it before a write's
    body is read (`scheduler.api.edge.BodyGuard`)."""
    if settings.admin_token is None:
        return ApiProblem(
            403,
            "writes_disabled",
            f"this call changes state and the daemon has no admin token: set {ADMIN_VAR} on "
            "the daemon to enable writes, then send it as 'Authorization: Bearer <token>'",
        )
    caller = identify(request, settings)
    if caller is None:
        return _unauthorized(request, ADMIN_VAR)
    if caller.kind != "admin":
        return ApiProblem(
            403,
            "forbidden",
            f"this call changes state and needs the admin token ({ADMIN_VAR}); "
            f"the read token ({READ_VAR}) only reads",
        )
    return None


def _unauthorized(request: Request, variable: str) -> ApiProblem:
    sent = request.headers.get("authorization")
    problem = "the bearer token is not one this daemon knows" if sent else "no bearer token"
    return ApiProblem(
        401,
        "unauthorized",
        f"{problem}: send 'Authorization: Bearer <token>' with the value of {variable}",
        headers=_CHALLENGE,
    )


Reader = Annotated[Caller, Depends(reader)]
Admin = Annotated[Caller, Depends(admin)]
