"""`/v1/activity`: the operator actions taken through the API (and so the console and the
CLI), newest first (`scheduler.api.activity` records them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from scheduler.api.auth import Reader
from scheduler.api.models import WORD, Instant
from scheduler.api.problems import responses
from scheduler.api.routes.common import Budgeted, Cursor, Limit, Ops
from scheduler.operations.activity_records import ActivityPage
from scheduler.operations.stores import ActivityFilter

router = APIRouter(prefix="/v1/activity", tags=["activity log"])
TEXT = r"^[^\x00-\x1f\x7f]{1,200}$"


@router.get(
    "",
    response_model=ActivityPage,
    responses=responses(400, 401, 403, 422, 503),
    dependencies=Budgeted,
)
async def list_activity(
    ops: Ops,
    _: Reader,
    action: Annotated[
        str | None, Query(pattern=WORD, description="pause, resume, trigger, cancel, ...")
    ] = None,
    target: Annotated[
        str | None,
        Query(pattern=TEXT, description="job name, task id or dead-letter id (exact)"),
    ] = None,
    who: Annotated[
        str | None,
        Query(pattern=TEXT, description="a prefix of who: `admin` matches admin@10.0.0.7"),
    ] = None,
    since: Annotated[Instant | None, Query(description="recorded at or after")] = None,
    until: Annotated[Instant | None, Query(description="recorded strictly before")] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> ActivityPage:
    """Operator actions, newest first: who, when, what, on which target, and the answer.
    Kept for SCHEDULER_ACTIVITY_RETENTION (90 days by default)."""
    where = ActivityFilter(action, target, who, since, until)
    got = await ops.activity.list(where, cursor, limit)
    return ActivityPage(items=got.items, next_cursor=got.next_cursor)
