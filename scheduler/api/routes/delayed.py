"""`/v1/delayed`: find, inspect, cancel and reschedule delayed tasks."""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from scheduler.api.auth import Admin, Reader
from scheduler.api.idempotency import IdempotencyKey, once
from scheduler.api.models import (
    SUBJECT,
    TASK_ID,
    Instant,
    Reschedule,
    TaskDetail,
    TaskOutcome,
    TaskPage,
)
from scheduler.api.problems import ApiProblem, links, responses
from scheduler.api.routes.common import Budgeted, Cursor, Limit, Ops, done, json_page
from scheduler.errors import TargetRefusedError
from scheduler.store.idempotency import Claim
from scheduler.store.overview import TaskFilter
from scheduler.subjects import check_target

router = APIRouter(prefix="/v1/delayed", tags=["delayed tasks"])
TaskId = Annotated[str, Path(pattern=TASK_ID, description="the envelope id")]
LIST = responses(400, 401, 403, 422, 503) | links(
    "task_id", "/items/0/id", "get_task", "cancel_task", "reschedule_task"
)
WRITE = responses(400, 401, 403, 404, 409, 422, 503)
# A task still on the delay lane has no row yet: naming its target lets a cancel (reschedule)
# wait for it, as the NATS verb does (scheduler.store.intents).
Target = Annotated[
    str | None,
    Query(
        pattern=SUBJECT,
        description="the task's target subject: with it, a task still on the delay lane (not "
        "yet taken by intake) is cancelled or rescheduled when it arrives",
    ),
]


def _target(task_id: str, target: str | None, ops: Ops) -> str | None:
    """`target` if the daemon may deliver there; else 404 naming it: no task can be there
    (the allow-list is the deployment's, so the schema cannot say it), and nothing is done."""
    if target is None:
        return None
    try:
        return check_target(target, ops.tasks.settings.target_allow)
    except TargetRefusedError as exc:
        detail = f"target: {exc}: no task of id {task_id!r} can be there"
        raise ApiProblem(404, "not_found", detail, id=task_id) from None


def _keyed(task_id: str, target: str | None) -> str:
    """What an Idempotency-Key is bound to: the task, and the target when one is named."""
    return task_id if target is None else f"{task_id} {target}"


@router.get("", response_model=TaskPage, responses=LIST, dependencies=Budgeted)
async def list_tasks(
    ops: Ops,
    _: Reader,
    subject: Annotated[
        str | None,
        Query(pattern=SUBJECT, description="target subject; `mq.tasks.>` matches a prefix"),
    ] = None,
    org_id: Annotated[
        str | None,
        Query(
            pattern=r"^[^\x00]{1,200}$",
            description="envelope org_id; fired tasks keep none (422 with status=fired)",
        ),
    ] = None,
    status: Annotated[
        str | None,
        Query(
            pattern=r"^[a-z_]{1,32}$",
            description="pending, in_doubt, claimed, fired, cancelled, expired, dead; "
            "none: every task, fired ones last",
        ),
    ] = None,
    due_before: Annotated[Instant | None, Query(description="due strictly before")] = None,
    due_after: Annotated[Instant | None, Query(description="due at or after")] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> Any:
    """Tasks in firing order (due time, priority, intake order); `status=fired` lists fired
    tasks, kept for SCHEDULER_FIRE_LOG_RETENTION days, in the order they fired (their due time
    is the delivery's `scheduled_for`), and without a status they follow the others.
    `status=pending` reads the pending index; `org_id` (the envelope's, kept in an indexed
    column) lists no fired task: their envelopes are deleted."""
    where = TaskFilter(subject, org_id, status, due_before, due_after)
    got = await ops.tasks.list(where, cursor, limit)
    return json_page(got.items, got.next_cursor)


@router.get("/{task_id}", response_model=TaskDetail, responses=responses(401, 403, 404, 422, 503))
async def get_task(task_id: TaskId, ops: Ops, _: Reader) -> Any:
    """One task: state, envelope, headers and every delivery recorded in the fire log."""
    task = await ops.tasks.detail(task_id)
    if task is None:
        raise ApiProblem(404, "not_found", f"no delayed task with id {task_id!r}", id=task_id)
    payload = task.pop("payload")
    if payload is None:  # fired: the row and its bytes are gone, the delivery is in the log
        task["envelope"] = task["payload_base64"] = None
        return task
    try:
        envelope = json.loads(payload)
    except ValueError:
        envelope = None
    task["envelope"] = envelope if isinstance(envelope, dict) else None
    encoded = base64.b64encode(payload).decode()
    task["payload_base64"] = None if task["envelope"] is not None else encoded
    return task


@router.delete(
    "/{task_id}", response_model=TaskOutcome, response_model_exclude_none=True, responses=WRITE
)
async def cancel_task(
    task_id: TaskId,
    ops: Ops,
    caller: Admin,
    request: Request,
    key: IdempotencyKey = None,
    target: Target = None,
) -> Any:
    """Cancel a pending task. 200 `cancelled` guarantees it is never delivered; 409 when it is
    already firing or done (`too_late`) or its publish is in doubt (`in_flight`). With
    `target`, a task still on the delay lane is cancelled too (it is stored cancelled when it
    arrives); 409 `id_contended` or `too_many_intents` as for the NATS `cancel` verb."""
    to = _target(task_id, target, ops)

    async def run(_: Claim | None) -> Any:
        outcome = await ops.tasks.cancel(task_id, to)
        return {"id": task_id, **done(caller, "cancel", outcome, "task")}

    return await once(request, ops, caller, key, _keyed(task_id, to), None, TaskOutcome, run, True)


@router.patch(
    "/{task_id}",
    response_model=TaskOutcome,
    response_model_exclude_none=True,
    responses=WRITE,
)
async def reschedule_task(
    task_id: TaskId,
    body: Reschedule,
    ops: Ops,
    caller: Admin,
    request: Request,
    key: IdempotencyKey = None,
    target: Target = None,
) -> Any:
    """Move a pending task to a new due time (same race rules as cancel; `target` as for
    cancel: a task still on the delay lane arrives at the new time)."""
    to = _target(task_id, target, ops)

    async def run(_: Claim | None) -> Any:
        outcome = await ops.tasks.reschedule(task_id, body.delay_until, to)
        return {"id": task_id, **done(caller, "reschedule", outcome, "task")}

    return await once(request, ops, caller, key, _keyed(task_id, to), body, TaskOutcome, run, True)
