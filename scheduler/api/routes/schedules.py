"""`/v1/schedules`: cron jobs with their next occurrences and latest fires; pause, resume,
trigger, backfill."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from scheduler.api.auth import Admin, Reader
from scheduler.api.idempotency import IdempotencyKey, once
from scheduler.api.models import (
    JOB_NAME,
    BackfillOutcome,
    BackfillWindow,
    PauseRequest,
    ScheduleOutcome,
    TriggerOutcome,
)
from scheduler.api.problems import ApiProblem, links, responses
from scheduler.api.routes.common import Budgeted, Cursor, Limit, Ops, done
from scheduler.operations.cron_job_records import ScheduleDetail, SchedulePage
from scheduler.operations.stores import Claim

router = APIRouter(prefix="/v1/schedules", tags=["cron jobs"])
Name = Annotated[str, Path(pattern=JOB_NAME, max_length=100, description="the job's name")]
WRITE = responses(400, 401, 403, 404, 409, 422, 503)


LIST = responses(400, 401, 403, 422, 503) | links(
    "name",
    "/items/0/name",
    "get_schedule",
    "pause_schedule",
    "resume_schedule",
    "trigger_schedule",
    "backfill_schedule",
)


@router.get("", response_model=SchedulePage, responses=LIST, dependencies=Budgeted)
async def list_schedules(
    ops: Ops,
    _: Reader,
    active: Annotated[
        bool | None, Query(description="true: jobs in YAML now (default); false: removed ones")
    ] = True,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> SchedulePage:
    """Cron jobs by name: spec, source file and line, paused or not, last occurrence; and the
    errors in the YAML files (`problems`)."""
    got = await ops.schedules.list(active, cursor, limit)
    problems = await ops.schedules.problems()
    return SchedulePage(items=got.items, next_cursor=got.next_cursor, problems=problems)


@router.get("/{name}", response_model=ScheduleDetail, responses=responses(401, 403, 404, 422, 503))
async def get_schedule(name: Name, ops: Ops, _: Reader) -> ScheduleDetail:
    """A job with its next 10 occurrences (the daemon's own cron code) and last 20 fires."""
    job = await ops.schedules.show(name)
    if job is None:
        raise ApiProblem(404, "not_found", f"no cron job named {name!r}", id=name)
    return job


@router.post("/{name}/pause", response_model=ScheduleOutcome, responses=WRITE)
async def pause_schedule(
    name: Name,
    ops: Ops,
    caller: Admin,
    request: Request,
    key: IdempotencyKey = None,
    body: PauseRequest | None = None,
) -> Any:
    """Stop firing the job until resumed (kept across reloads and restarts); occurrences
    while paused are skipped, not caught up. An optional body `{"note": "why"}` is kept with
    the job (`pause_note`, beside `paused_by` and `paused_at`) until it is resumed."""
    note = body.note if body is not None else None

    async def run(_: Claim | None) -> Any:
        outcome = await ops.schedules.pause(name, caller.who, note)
        return {"name": name, **done(caller, "pause", outcome, "job")}

    return await once(request, ops, caller, key, name, body, ScheduleOutcome, run)


@router.post("/{name}/resume", response_model=ScheduleOutcome, responses=WRITE)
async def resume_schedule(
    name: Name, ops: Ops, caller: Admin, request: Request, key: IdempotencyKey = None
) -> Any:
    """Undo an operator's pause, and clear a failed mark (the job is tried again); 409
    `paused_in_yaml` when YAML itself says paused."""

    async def run(_: Claim | None) -> Any:
        outcome = await ops.schedules.resume(name)
        return {"name": name, **done(caller, "resume", outcome, "job")}

    return await once(request, ops, caller, key, name, None, ScheduleOutcome, run)


@router.post("/{name}/trigger", response_model=TriggerOutcome, responses=WRITE)
async def trigger_schedule(
    name: Name, ops: Ops, caller: Admin, request: Request, key: IdempotencyKey = None
) -> Any:
    """Fire the job once now with `Nats-Msg-Id` `<job>@manual-<instant>` (with an
    Idempotency-Key: `<job>@manual-key-<digest of the key>`, so a retry's publish is dropped
    as a duplicate) and a fire-log row; its regular occurrences are unaffected. Once the
    publish is acknowledged the answer is `triggered`; `fire_log` says whether the log row is
    written or still `pending` (PostgreSQL unreachable: the daemon retries it)."""

    async def run(claim: Claim | None) -> Any:
        scoped = None if claim is None else f"{claim.use.scope}:{claim.use.key}"
        at = None if claim is None else claim.first_at
        outcome = await ops.schedules.trigger(name, scoped, at)
        return {"name": name, **done(caller, "trigger", outcome, "job")}

    return await once(request, ops, caller, key, name, None, TriggerOutcome, run)


@router.post("/{name}/backfill", response_model=BackfillOutcome, responses=WRITE)
async def backfill_schedule(
    name: Name,
    body: BackfillWindow,
    ops: Ops,
    caller: Admin,
    request: Request,
    key: IdempotencyKey = None,
) -> Any:
    """Fire each occurrence of the job in `[from, to)` once (the daemon's cron code, in the
    job's time zone), as `<job>@backfill-<occurrence>` with a manual fire-log row; an
    occurrence an earlier backfill fired is not fired again (`already_fired`). 422 when `to`
    is in the future or the window holds more than 1,000 occurrences; 409
    `previous_run_held` for a `concurrency: forbid` job whose subject still holds a message.
    `dry_run` counts and lists, firing nothing."""

    async def run(_: Claim | None) -> Any:
        outcome = await ops.schedules.backfill(name, body.from_, body.to, body.dry_run)
        action = "backfill_dry_run" if body.dry_run else "backfill"
        return {"name": name, **done(caller, action, outcome, "job")}

    return await once(request, ops, caller, key, name, body, BackfillOutcome, run)
