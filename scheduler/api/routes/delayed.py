"""`/v1/delayed`: schedule, find, inspect, cancel and reschedule delayed tasks."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ValidationError

from scheduler.api.auth import Admin, Reader
from scheduler.api.idempotency import IdempotencyKey, once
from scheduler.api.models import (
    SUBJECT,
    TASK_ID,
    TASK_STATUSES,
    DelayedShort,
    Instant,
    Reschedule,
    TaskOutcome,
)
from scheduler.api.problems import ApiProblem, links, responses
from scheduler.api.routes.common import Budgeted, Cursor, Limit, Ops, done, json_page
from scheduler.clock import to_rfc3339
from scheduler.durations import parse_duration
from scheduler.errors import DurationError, EnvelopeError, TargetRefusedError
from scheduler.messages.envelope import (
    SCHEMA,
    Limits,
    check_org,
    parse_envelope,
    refuse_duplicate_key,
)
from scheduler.messages.subjects import check_target
from scheduler.operations import Outcome
from scheduler.operations.ports import WriteFailed
from scheduler.operations.stores import Claim, TaskFilter
from scheduler.operations.task_records import DelayedScheduled, TaskDetail, TaskPage

router = APIRouter(prefix="/v1/delayed", tags=["delayed tasks"])
TaskId = Annotated[str, Path(pattern=TASK_ID, description="the envelope id")]
LIST = responses(400, 401, 403, 422, 503) | links(
    "task_id", "/items/0/id", "get_task", "cancel_task", "reschedule_task"
)
WRITE = responses(400, 401, 403, 404, 409, 422, 503)
# A task still on the delay lane has no row yet: naming its target lets a cancel (reschedule)
# wait for it, as the NATS verb does (scheduler.store.postgres.intents).
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
    if status is not None and status not in TASK_STATUSES:
        allowed = ", ".join(TASK_STATUSES)
        detail = f"status: {status!r} is not a task status; use one of {allowed} (or none: all)"
        errors = [{"field": "query.status", "message": detail}]
        raise ApiProblem(400, "bad_status", detail, errors=errors)
    where = TaskFilter(subject, org_id, status, due_before, due_after)
    got = await ops.tasks.list(where, cursor, limit)
    return json_page(got.items, got.next_cursor)


@router.get("/{task_id}", response_model=TaskDetail, responses=responses(401, 403, 404, 422, 503))
async def get_task(task_id: TaskId, ops: Ops, _: Reader) -> TaskDetail:
    """One task: state, envelope, headers and every delivery recorded in the fire log."""
    task = await ops.tasks.detail(task_id)
    if task is None:
        raise ApiProblem(404, "not_found", f"no delayed task with id {task_id!r}", id=task_id)
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


# -- schedule ----------------------------------------------------------------------------------
ENVELOPE_SCHEMA: dict[str, Any] = {
    "title": "Envelope",
    "type": "object",
    "description": "a whole hanzo.mq.v1 envelope, delivered byte for byte (docs/producers.md); "
    "the target is the `subject` query parameter",
    "required": ["schema", "id", "type", "source", "timestamp", "data"],
    "properties": {
        "schema": {"type": "string", "enum": ["hanzo.mq.v1"]},
        "id": {"type": "string", "pattern": TASK_ID},
        "type": {"type": "string"},
        "source": {"type": "string"},
        "timestamp": {"type": "string", "format": "date-time"},
        "delay_until": {"type": "string", "format": "date-time"},
        "priority": {"type": "integer", "minimum": 1, "maximum": 10},
        "org_id": {"type": "string"},
        "ttl_seconds": {"type": "integer", "minimum": 1},
        "data": {"type": "object"},
    },
}
SCHEDULE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [DelayedShort.model_json_schema(by_alias=True), ENVELOPE_SCHEMA]
                }
            }
        },
    }
}
CREATE = responses(400, 401, 403, 409, 422, 503)
DEFAULT_TYPE = "delayed"
SOURCE = "scheduler-api"
EnvelopeTarget = Annotated[
    str | None,
    Query(
        pattern=SUBJECT,
        description="the target subject, required with a whole envelope as the body (the short "
        "form names it in `subject`)",
    ),
]


class _Request(BaseModel):
    """What an Idempotency-Key is bound to for a schedule: the body's exact bytes."""

    sha256: str


@router.post(
    "",
    response_model=DelayedScheduled,
    responses=CREATE,
    openapi_extra=SCHEDULE_BODY,
    operation_id="schedule_task",
)
async def schedule_task(
    ops: Ops,
    caller: Admin,
    request: Request,
    key: IdempotencyKey = None,
    subject: EnvelopeTarget = None,
) -> Any:
    """Schedule a delayed task, as the NATS `schedule` verb does (same checks, org rule and
    answer): the body is a whole `hanzo.mq.v1` envelope (target in `subject`), or the short
    form. 200 `scheduled` once the delay lane acknowledged it: the task is durable, and a
    cancel naming its `target` holds from then on. The organisation quota is judged at
    intake, after this answer: a task over it is dead-lettered `quota_exceeded`."""
    raw = await request.body()
    doc = _object(raw)
    short = None if "schema" in doc else _short(raw, subject)
    target = _scheduled_target(short.subject if short else subject, ops)
    body = raw if short is None else _written(short, ops.clock.now(), None)
    _judge(ops, target, body)  # invalid input answers before the key is looked at

    async def run(claim: Claim | None) -> Any:
        at = ops.clock.now() if claim is None else claim.first_at
        sent = raw if short is None else _written(short, at, claim)
        answer = await _put(ops, target, sent, at)
        outcome = Outcome("scheduled", answer.id, data={"target": target, "due_at": answer.due_at})
        return {"id": answer.id, **done(caller, "schedule", outcome, "task")}

    fingerprint = _Request(sha256=hashlib.sha256(raw).hexdigest())
    return await once(request, ops, caller, key, target, fingerprint, DelayedScheduled, run)


def _object(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        detail = f"body: not valid JSON ({exc})"
        raise ApiProblem(
            400, "bad_json", detail, errors=[{"field": "body", "message": detail}]
        ) from None
    if not isinstance(doc, dict):
        detail = (
            f"body: must be a JSON object (an envelope or the short form), got {type(doc).__name__}"
        )
        raise ApiProblem(422, "validation", detail, errors=[{"field": "body", "message": detail}])
    try:  # either form: parsers disagree which of two equal keys counts
        refuse_duplicate_key(raw)
    except EnvelopeError as exc:
        raise _refused(exc) from None
    return doc


def _short(raw: bytes, subject: str | None) -> DelayedShort:
    try:
        short = DelayedShort.model_validate_json(raw)
    except ValidationError as exc:
        errors = [_field(e) for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise ApiProblem(422, "validation", detail, errors=errors) from None
    if subject is not None and subject != short.subject:
        detail = f"subject: the query names {subject!r} and the body {short.subject!r}; give one"
        raise ApiProblem(
            422, "validation", detail, errors=[{"field": "query.subject", "message": detail}]
        )
    return short


def _field(error: Any) -> dict[str, str]:
    loc = ".".join(str(part) for part in ("body", *error.get("loc", ())))
    return {"field": loc, "message": str(error.get("msg", "invalid")).removeprefix("Value error, ")}


def _scheduled_target(subject: str | None, ops: Ops) -> str:
    if subject is None:
        detail = "subject: required (query parameter) when the body is a whole envelope"
        raise ApiProblem(
            422, "validation", detail, errors=[{"field": "query.subject", "message": detail}]
        )
    try:
        return check_target(subject, ops.tasks.settings.target_allow)
    except TargetRefusedError as exc:
        raise ApiProblem(
            422, "target_refused", str(exc), errors=[{"field": "subject", "message": str(exc)}]
        ) from None


def _judge(ops: Ops, target: str, body: bytes) -> None:
    """The envelope checks the lane's publish would face, answered now: 422 naming the field."""
    limits = Limits(max_payload=ops.tasks.bus.max_payload, max_delay=ops.tasks.settings.max_delay)
    try:
        check_org(parse_envelope(body, ops.clock.now(), limits), target)
    except EnvelopeError as exc:
        raise _refused(exc) from None


def _refused(exc: EnvelopeError) -> ApiProblem:
    errors = [{"field": field, "message": message} for field, message in exc.problems]
    return ApiProblem(422, exc.reason, str(exc), errors=errors)


async def _put(ops: Ops, target: str, body: bytes, at: datetime) -> DelayedScheduled:
    try:
        return await ops.tasks.schedule(target, body, at)
    except EnvelopeError as exc:
        raise _refused(exc) from None
    except WriteFailed as exc:
        detail = (
            f"the delay lane did not acknowledge the task ({exc}): it may or may not be "
            "scheduled; retry with the same Idempotency-Key"
        )
        if not exc.maybe_stored:
            detail = f"the delay lane refused the task ({exc}): it is not scheduled"
        raise ApiProblem(503, "unavailable", detail, headers={"Retry-After": "1"}) from None


def _written(short: DelayedShort, at: datetime, claim: Claim | None) -> bytes:
    """The short form's envelope as of `at`: `in` counts from `at` (an idempotent request's
    first instant), and without an `id` one is made, from the key when there is one, so a
    retry writes the same bytes (intake takes an exact resend as a no-op)."""
    try:
        due = short.at if short.at is not None else at + parse_duration(short.in_ or "0s")
    except DurationError as exc:
        raise ApiProblem(
            422, "validation", f"in: {exc}", errors=[{"field": "body.in", "message": str(exc)}]
        ) from None
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "id": short.id or _new_id(claim),
        "type": short.type or DEFAULT_TYPE,
        "source": SOURCE,
        "timestamp": to_rfc3339(at),
        "priority": short.priority,
        "delay_until": to_rfc3339(due),
        "data": short.data,
    }
    if short.org_id is not None:
        doc["org_id"] = short.org_id
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _new_id(claim: Claim | None) -> str:
    if claim is None:
        return str(uuid.uuid4())
    scoped = f"{claim.use.scope}:{claim.use.key}"
    return "key-" + hashlib.sha256(scoped.encode()).hexdigest()[:32]
