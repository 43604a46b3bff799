"""What every management route needs: the operations (503 while starting), write logging."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.responses import StreamingResponse
from pydantic_core import to_json

from scheduler.api.auth import Caller, identify
from scheduler.api.gate import RETRY_AFTER_SECONDS, Overloaded, QueryGate
from scheduler.api.problems import ApiProblem, from_outcome
from scheduler.operations import Outcome
from scheduler.operations.build import Operations

log = logging.getLogger("scheduler.api")

MAX_LIMIT = 500
CHUNK = 100  # items serialised between two yields to the event loop
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
        raise ApiProblem(
            503,
            "overloaded",
            f"{exc.limit} management API requests are already running "
            "(SCHEDULER_API_MAX_CONCURRENT); retry after the Retry-After delay",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from None


def _may_query(request: Request) -> bool:
    """Whether the request carries a configured token, or the API is open (no token set)."""
    settings = request.app.state.backend.settings
    if settings.admin_token is None and settings.read_token is None:
        return True
    return identify(request, settings) is not None


Ops = Annotated[Operations, Depends(operations)]


def log_write(caller: Caller, action: str, outcome: Outcome) -> None:
    """Every write is logged: who (token kind and address), what, which id, the result."""
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


def streamed_page(items: list[dict[str, Any]], drop: tuple[str, ...] = (), **rest: Any) -> Any:
    """A page `{"items": [...], **rest}` written in chunks of CHUNK items with the event loop
    free between two (the daemon fires from the same loop): one 500-row page in one piece
    holds it for a millisecond or more, a chunk for a tenth of that. The `drop` keys (sort keys
    used only for the cursor) are removed from the items first; the items are the store's own
    rows (str, int, datetime, None), so they are written as they are, not validated again."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"items":['
        for start in range(0, len(items), CHUNK):
            part = items[start : start + CHUNK]
            for item in part:
                for key in drop:
                    item.pop(key, None)
            yield (b"," if start else b"") + to_json(part)[1:-1]
            await asyncio.sleep(0)
        yield b"]," + to_json(rest)[1:]

    return StreamingResponse(chunks(), media_type="application/json")
