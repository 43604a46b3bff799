"""`/v1/dead-letters`: what failed and why; replay one or a filtered batch; resolve."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from scheduler.api.auth import Admin, Reader
from scheduler.api.idempotency import IdempotencyKey, once
from scheduler.api.models import (
    SUBJECT,
    WORD,
    ReplayBatch,
    ReplayBatchResult,
    ReplayOutcome,
    Resolve,
    Stage,
)
from scheduler.api.problems import ApiProblem, links, responses
from scheduler.api.routes.common import Budgeted, Cursor, Limit, Ops, done, log_write
from scheduler.operations import Outcome
from scheduler.operations.dead_letter_records import DeadLetterDetail, DeadLetterPage
from scheduler.operations.stores import Claim, DeadLetterFilter

router = APIRouter(prefix="/v1/dead-letters", tags=["dead letters"])
WRITE = responses(400, 401, 403, 404, 409, 422, 503)


LIST = responses(400, 401, 403, 422, 503) | links(
    "dead_id", "/items/0/id", "get_dead_letter", "replay_one", "resolve_dead_letter"
)


@router.get("", response_model=DeadLetterPage, responses=LIST, dependencies=Budgeted)
async def list_dead_letters(
    ops: Ops,
    _: Reader,
    reason: Annotated[str | None, Query(pattern=WORD, description="e.g. publish_failed")] = None,
    subject: Annotated[
        str | None, Query(pattern=SUBJECT, description="target or original subject; `.>` prefix")
    ] = None,
    stage: Stage | None = None,
    resolved: bool | None = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> DeadLetterPage:
    """Dead letters, newest failure first."""
    got = await ops.dead_letters.list(
        DeadLetterFilter(reason, subject, stage, resolved), cursor, limit
    )
    return DeadLetterPage(items=got.items, next_cursor=got.next_cursor)


@router.get(
    "/{dead_id:uuid}", response_model=DeadLetterDetail, responses=responses(401, 403, 404, 422, 503)
)
async def get_dead_letter(dead_id: uuid.UUID, ops: Ops, _: Reader) -> DeadLetterDetail:
    """One dead letter with its payload, headers and the stored bytes."""
    return _detail(await ops.dead_letters.show(dead_id), dead_id)


@router.post("/replay", response_model=ReplayBatchResult, responses=WRITE)
async def replay_batch(
    body: ReplayBatch, ops: Ops, caller: Admin, request: Request, key: IdempotencyKey = None
) -> Any:
    """Replay up to `limit` unresolved dead letters matching the filter, newest first; each
    result says `replayed` or why not. Never replays one twice."""

    async def run(_: Claim | None) -> Any:
        where = DeadLetterFilter(body.reason, body.subject, body.stage, resolved=False)
        outcomes = await ops.dead_letters.replay_many(where, body.limit, caller.who)
        for outcome in outcomes:
            log_write(caller, "replay", outcome)
        replayed = sum(o.ok for o in outcomes)
        results = [_replay_result(o) for o in outcomes]
        return {"replayed": replayed, "refused": len(outcomes) - replayed, "results": results}

    return await once(request, ops, caller, key, "*", body, ReplayBatchResult, run)


@router.post(
    "/{dead_id:uuid}/replay",
    response_model=ReplayOutcome,
    response_model_exclude_none=True,
    responses=WRITE,
)
async def replay_one(
    dead_id: uuid.UUID, ops: Ops, caller: Admin, request: Request, key: IdempotencyKey = None
) -> Any:
    """Replay one dead letter through the normal path (see the dead letters guide): a task that
    died firing goes back to pending (same id, attempts from zero); bad intake is validated
    again and re-published to the delay lane. The target is re-checked against the allow-list."""

    async def run(_: Claim | None) -> Any:
        outcome = await ops.dead_letters.replay(dead_id, caller.who)
        return {"id": str(dead_id), **done(caller, "replay", outcome, "dead letter")}

    return await once(request, ops, caller, key, str(dead_id), None, ReplayOutcome, run, True)


@router.patch("/{dead_id:uuid}", response_model=DeadLetterDetail, responses=WRITE)
async def resolve_dead_letter(
    dead_id: uuid.UUID,
    body: Resolve,
    ops: Ops,
    caller: Admin,
    request: Request,
    key: IdempotencyKey = None,
) -> Any:
    """Mark a dead letter resolved (handled, nothing to replay), or open it again."""

    async def run(_: Claim | None) -> Any:
        dead = await ops.dead_letters.resolve(dead_id, body.resolved, caller.who)
        status = "not_found" if dead is None else "resolved" if body.resolved else "reopened"
        log_write(caller, "resolve", Outcome(status, str(dead_id)))
        return _detail(dead, dead_id)

    return await once(request, ops, caller, key, str(dead_id), body, DeadLetterDetail, run)


def _detail(dead: DeadLetterDetail | None, dead_id: uuid.UUID) -> DeadLetterDetail:
    if dead is None:
        raise ApiProblem(404, "not_found", f"no dead letter with id {dead_id}", id=str(dead_id))
    return dead


def _replay_result(outcome: Outcome) -> dict[str, Any]:
    return {
        "id": outcome.id,
        "status": outcome.status,
        "detail": outcome.detail or None,
        **outcome.data,
    }
