"""What the edge refuses before routing, for the price of a header lookup.

A client that ignores `Retry-After`, or one that floods without a token, is answered over and
over: each answer must cost next to nothing, no routing, no dependency, no query. So a call
under `/v1/` (but `/v1/leader`, which needs no token) is answered here, before FastAPI sees it,
when it carries no token it needs (401/403, the answers of `scheduler.api.auth`) or when every
admission slot is taken (503 `overloaded` with `Retry-After`, `scheduler.api.gate`). What
passes is checked again by the route's own dependencies, which decide alone for the console
and the rest of the app.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from scheduler.api import auth, problems
from scheduler.api.gate import QueryGate
from scheduler.api.problems import ApiProblem
from scheduler.api.routes.common import overloaded
from scheduler.settings import Settings

PUBLIC = frozenset({"/v1/leader"})
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class EarlyRefusal:
    """401/403 for a `/v1/` call without the token it needs; 503 while the gate is full."""

    def __init__(self, app: ASGIApp, settings: Callable[[], Settings], gate: QueryGate) -> None:
        self.app = app
        self.settings = settings  # the daemon's, read per request as the auth dependencies do
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if _guarded(scope) else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        answer = problems.problem_response(
            refusal.status, refusal.code, refusal.detail, refusal.headers, **refusal.extra
        )
        await answer(scope, receive, send)

    def _refusal(self, scope: Scope) -> ApiProblem | None:
        request, settings = Request(scope), self.settings()
        if scope["method"] in WRITES:
            refusal = auth.write_refusal(request, settings)
        else:
            refusal = auth.read_refusal(request, settings)
        if refusal is None and self.gate.full:
            return overloaded(self.gate.limit)
        return refusal


def _guarded(scope: Scope) -> bool:
    if scope["type"] != "http":
        return False
    path = scope["path"]
    return bool(path.startswith("/v1/") and path not in PUBLIC)
