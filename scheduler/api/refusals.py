"""What the edge refuses before routing, for the price of a header lookup.

A client that ignores `Retry-After`, or one that floods without a token, is answered over and
over: each answer must cost next to nothing, no routing, no dependency, no query. So a call
under `/v1/` (but `/v1/leader`, which needs no token) is answered here, before FastAPI sees it,
when it carries no token it needs (401/403, the answers of `scheduler.api.auth`), when every
admission slot is taken, or when it is a listing the rows budget cannot pay within its wait
(503 `overloaded` with `Retry-After`, `scheduler.api.gate`: 24 clients ignoring Retry-After
kept the edge routing 9,000 such refusals in 20 s). What
passes is checked again by the route's own dependencies, which decide alone for the console
and the rest of the app.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from scheduler.api import auth, problems
from scheduler.api.gate import QueryGate, RowBudget
from scheduler.api.problems import ApiProblem
from scheduler.api.routes.common import out_of_budget, overloaded, page_size
from scheduler.settings import Settings

PUBLIC = frozenset({"/v1/leader"})
# the listings that pay from the rows budget (`scheduler.api.routes.common.Budgeted`)
LISTINGS = frozenset({"/v1/delayed", "/v1/dead-letters", "/v1/schedules", "/v1/activity"})
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class EarlyRefusal:
    """401/403 for a `/v1/` call without the token it needs; 503 while the gate is full."""

    def __init__(
        self,
        app: ASGIApp,
        settings: Callable[[], Settings],
        gate: QueryGate,
        budget: RowBudget | None = None,
    ) -> None:
        self.app = app
        self.settings = settings  # the daemon's, read per request as the auth dependencies do
        self.gate = gate
        self.budget = budget

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
        if refusal is None and self.budget is not None and _listing(scope):
            rows = page_size(request.query_params.get("limit", "50"))
            retry_after = self.budget.refusal(rows) if rows is not None else None
            if retry_after is not None:
                return out_of_budget(self.budget.per_second, retry_after)
        return refusal


def _listing(scope: Scope) -> bool:
    return scope["method"] == "GET" and scope["path"].rstrip("/") in LISTINGS


def _guarded(scope: Scope) -> bool:
    if scope["type"] != "http":
        return False
    path = scope["path"]
    return bool(path.startswith("/v1/") and path not in PUBLIC)
