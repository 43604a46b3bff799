"""What every management route needs: the operations (503 while starting), write logging."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import Depends, Query, Request

from scheduler.api.auth import Caller
from scheduler.api.problems import ApiProblem, from_outcome
from scheduler.operations import Outcome
from scheduler.operations.build import Operations

log = logging.getLogger("scheduler.api")

MAX_LIMIT = 500
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"page size, 1..{MAX_LIMIT}")]
Cursor = Annotated[
    str | None,
    Query(max_length=1024, pattern=r"^[A-Za-z0-9_-]+$", description="next_cursor of a page"),
]


def operations(request: Request) -> Operations:
    ops = request.app.state.backend.operations
    if ops is None:
        raise ApiProblem(
            503,
            "unavailable",
            "this instance is still connecting or already stopping; retry shortly or ask "
            "another instance",
        )
    return ops  # type: ignore[no-any-return]


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
