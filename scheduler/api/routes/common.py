"""What every management route needs: the operations (503 while starting), write logging."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.responses import Response

from scheduler.aio import measuring_use
from scheduler.api import activity
from scheduler.api.auth import Caller, identify
from scheduler.api.gate import RETRY_AFTER_SECONDS, OutOfBudget, Overloaded, QueryGate, RowBudget
from scheduler.api.problems import ApiProblem, from_outcome
from scheduler.operations import Outcome
from scheduler.operations.bundle import Operations

log = logging.getLogger(__name__)

MAX_LIMIT = 500
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"page size, 1..{MAX_LIMIT}")]
Cursor = Annotated[
    str | None,
    Query(max_length=1024, pattern=r"^[A-Za-z0-9_-]+$", description="next_cursor of a page"),
]


async def operations(request: Request) -> AsyncIterator[Operations]:
    """The operations, inside one of the API's admission slots (`scheduler.api.gate`) for the
    whole request; 503 with Retry-After at once when every slot is taken. A request with no
    valid token takes no slot: its route's token check refuses it before any query."""
    backend = request.app.state.backend
    ops = backend.operations
    if ops is None:
        raise ApiProblem(
            503,
            "unavailable",
            "this instance is still connecting or already stopping; retry shortly or ask "
            "another instance",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if not _may_query(request):
        yield ops
        return
    gate: QueryGate = request.app.state.query_gate
    try:
        with gate.slot():
            yield ops
    except Overloaded as exc:
        raise overloaded(exc.limit) from None


def overloaded(limit: int) -> ApiProblem:
    """503 `overloaded`: every admission slot is taken (also answered by the edge before
    routing: `scheduler.api.refusals`)."""
    return ApiProblem(
        503,
        "overloaded",
        f"{limit} management API requests are already running "
        "(SCHEDULER_API_MAX_CONCURRENT); retry after the Retry-After delay",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


async def rows_budget(request: Request, _: Ops) -> AsyncIterator[None]:
    """A listing pays its `limit` from the API's rows budget (`scheduler.api.gate`) before it
    queries, waiting (up to a second, inside its admission slot: `Ops` is the same slot the
    route uses) until the budget has it; 503 `overloaded` with
    Retry-After when it would wait longer. Once the route is done it pays for its queries'
    time too (`RowBudget.settle`): the time its PostgreSQL connections were held, not the
    route's: its wait for a pooled connection and its work outside its queries are not work
    it made PostgreSQL do (charged as such, a console page's concurrent reads on a busy host
    were charged their waits for the pool's few connections several times over). A request with no
    valid token, or a `limit` its route will refuse 422, pays nothing."""
    limit = page_size(request.query_params.get("limit", "50"))
    if limit is None or not _may_query(request):
        yield
        return
    budget: RowBudget = request.app.state.rows_budget
    try:
        wait = budget.reserve(limit)
    except OutOfBudget as exc:
        raise out_of_budget(exc.per_second, exc.retry_after) from None
    if wait:
        await asyncio.sleep(wait)
    with measuring_use() as used:
        try:
            yield
        finally:
            budget.settle(limit, used.seconds)


def out_of_budget(per_second: int, retry_after: int) -> ApiProblem:
    """503 `overloaded`: the rows budget cannot pay this listing now (also answered by the
    edge before routing: `scheduler.api.refusals`)."""
    return ApiProblem(
        503,
        "overloaded",
        f"the management API's listings may read {per_second} rows per second "
        "(SCHEDULER_API_READ_ROWS_PER_SECOND) and have read them; retry after the "
        "Retry-After delay",
        headers={"Retry-After": str(retry_after)},
    )


def page_size(raw: str) -> int | None:
    """The page size asked for, when valid (the route's own `Limit` reports it otherwise)."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3):
        return None
    return int(raw) if 1 <= int(raw) <= MAX_LIMIT else None


def _may_query(request: Request) -> bool:
    """Whether the request carries a configured token, or the API is open (no token set)."""
    settings = request.app.state.backend.settings
    if settings.admin_token is None and settings.read_token is None:
        return True
    return identify(request, settings) is not None


Ops = Annotated[Operations, Depends(operations)]


def log_write(caller: Caller, action: str, outcome: Outcome) -> None:
    """Every write is logged: who (token kind and address), what, which id, the result; and
    noted for the request's activity-log row (`scheduler.api.activity`)."""
    activity.noted(action, outcome)
    log.info(
        "api.write who=%s action=%s id=%s outcome=%s",
        caller.who,
        action,
        outcome.id,
        outcome.status,
    )


def done(caller: Caller, action: str, outcome: Outcome, what: str) -> dict[str, Any]:
    """Log a write; raise its problem unless it succeeded, else return the answer's fields."""
    log_write(caller, action, outcome)
    if not outcome.ok:
        raise from_outcome(outcome, what)
    return {"status": outcome.status, **outcome.data}


def json_page(docs: list[str], next_cursor: str | None) -> Response:
    """A page `{"items": [...], "next_cursor": ...}` whose items are JSON texts PostgreSQL
    wrote: joined, not parsed, so a 500-task page costs the event loop a few tens of
    microseconds instead of decoding and re-encoding 5,000 values."""
    body = '{"items":[' + ",".join(docs) + '],"next_cursor":' + json.dumps(next_cursor) + "}"
    return Response(body.encode(), media_type="application/json")


Budgeted = [Depends(rows_budget)]
