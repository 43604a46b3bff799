"""Delayed tasks: look up, list, cancel and reschedule (NATS service and HTTP API alike).

Cancel and reschedule are single statements on the task's row that succeed only while it is
`pending` and not claimed (or, for a task still on the delay lane, record an intent that intake
honours: scheduler.store.postgres.intents): the leader claims a task (reported `claimed`) before
publishing it, so a `cancelled` answer that committed first guarantees no delivery, and one
that comes after answers `too_late` (or whatever the store says the task is now). A
reschedule also tells the leader over NATS so its in-memory heap moves the task at once; a
lost notice is caught by the leader's sweep.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

from scheduler.clock import Clock, to_rfc3339_us
from scheduler.engine.delayed import rescheduled
from scheduler.errors import RequestError
from scheduler.messages.envelope import (
    ID_RULE,
    Limits,
    bounded_instant,
    check_org,
    parse_envelope,
    valid_id,
)
from scheduler.messages.subjects import delay_lane_prefix, delay_subject
from scheduler.operations import Outcome
from scheduler.operations.paging import (
    PRIORITY,
    SEQ,
    TASK_ID,
    TIME,
    Page,
    bad_cursor,
    decode,
    encode,
    from_us,
    kind_of,
)
from scheduler.operations.ports import BusWriter
from scheduler.operations.stores import Listed, TaskControl, TaskFilter, TaskReads
from scheduler.operations.task_records import DelayedScheduled, TaskDetail, TaskState
from scheduler.records import TaskRef, ceil_ms
from scheduler.settings import Settings

CURSOR = "delayed"
FIRED_CURSOR = "delayed_fired"  # continues among fired tasks (`fired_at`, id)


def parse_due(raw: Any) -> datetime:
    """A new due time as sent over the NATS service: an ISO 8601 string with an offset."""
    if not isinstance(raw, str):
        raise RequestError(
            "bad_request", "delay_until: must be an ISO 8601 string with an offset", "delay_until"
        )
    try:
        due = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise RequestError(
            "bad_request", f"delay_until: {raw!r} is not ISO 8601", "delay_until"
        ) from None
    if due.tzinfo is None:
        raise RequestError(
            "bad_request", "delay_until: must carry a UTC offset or Z", "delay_until"
        )
    return due


class TaskOperations:
    def __init__(
        self,
        bus: BusWriter,
        settings: Settings,
        tasks: TaskControl,
        overview: TaskReads,
        clock: Clock,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.tasks = tasks
        self.overview = overview
        self.clock = clock

    async def schedule(
        self, target: str, raw: bytes, now: datetime | None = None
    ) -> DelayedScheduled:
        """Validate the envelope `raw` for the checked `target` (envelope rules, size against
        the server's max_payload, max delay, org rule) and put it on the delay lane; the task is
        durable once this returns (the lane's PubAck). The NATS `schedule` verb and
        `POST /v1/delayed` both answer with this. The organisation quota is judged later, at
        intake: a task over it is dead-lettered `quota_exceeded`, never delivered.

        `now` is the instant the envelope is judged at (the API passes an idempotent request's
        first instant, so a retry judges the same bytes the same way). A lane that does not
        acknowledge the task raises `scheduler.operations.ports.WriteFailed`."""
        limits = Limits(max_payload=self.bus.max_payload, max_delay=self.settings.max_delay)
        env = parse_envelope(raw, now or self.clock.now(), limits)
        check_org(env, target)
        subject = delay_subject(target, delay_lane_prefix(self.settings.intake_subject))
        # before the publish: a cancel naming no target, on any instance, finds it from then on
        await self.tasks.note_lane(env.id, target)
        # no Nats-Msg-Id: the lane's window is shared by all producers (see client.publish_delayed)
        await self.bus.store(subject, raw)
        due = ceil_ms(env.due_at(now or self.clock.now()))  # as intake stores it
        return DelayedScheduled(
            status="scheduled", id=env.id, target=target, due_at=to_rfc3339_us(due)
        )

    async def get(self, task_id: str, target: str | None = None) -> TaskState | None:
        """A task's state (no payload), only if it targets `target` when one is given."""
        check_id(task_id)
        row = await self.tasks.get(task_id, target)
        return None if row is None else TaskState.model_validate(row)

    async def detail(self, task_id: str) -> TaskDetail | None:
        """A task with its envelope (or, when its bytes are not a JSON object, the bytes in
        base64), headers and deliveries; a fired task has neither: its row is gone."""
        doc = await self.overview.task(task_id)
        if doc is None:
            return None
        payload: bytes | None = doc.pop("payload")
        envelope = None if payload is None else _json_object(payload)
        encoded = None
        if payload is not None and envelope is None:
            encoded = base64.b64encode(payload).decode()
        return TaskDetail.model_validate(doc | {"envelope": envelope, "payload_base64": encoded})

    async def list(self, where: TaskFilter, cursor: str | None, limit: int) -> Page[str]:
        """Tasks still held (any status but fired) in firing order, or fired tasks in the
        order they fired; without a status, the held ones and then the fired ones (a fired
        task keeps no `org_id`, so that filter lists held tasks only, and refuses `fired`).
        Each item is the task's summary as JSON text, written by PostgreSQL."""
        fired_key = _fired_key(cursor)
        if where.status == "fired" and where.org_id is not None:
            raise RequestError(
                "validation",
                "org_id: a fired task keeps no org_id (its envelope is deleted when it fires); "
                "leave org_id out with status=fired",
                "org_id",
            )
        held = where.status != "fired"
        with_fired = where.status in (None, "fired") and where.org_id is None
        rows: list[Listed] = []
        if held and fired_key is None:
            key = decode(CURSOR, cursor, (TIME, PRIORITY, SEQ))
            after = None if key is None else (from_us(key[0]), key[1], key[2])
            rows = await self.overview.tasks(where, after, limit + 1)
        elif not with_fired or (fired_key is None and cursor is not None):
            raise bad_cursor()  # a fired cursor on a list without fired tasks, or the reverse
        if with_fired and len(rows) <= limit:
            after_fired = None if fired_key is None else (from_us(fired_key[0]), fired_key[1])
            rows += await self.overview.fired(where, after_fired, limit + 1 - len(rows))
        docs = [row.doc for row in rows]
        if len(rows) <= limit:
            return Page(docs, None)
        last = rows[limit - 1].key  # three parts for a held task, two for a fired one
        return Page(docs[:limit], encode(CURSOR if len(last) == 3 else FIRED_CURSOR, last))

    async def cancel(self, task_id: str, target: str | None = None) -> Outcome:
        """`cancelled` (no delivery will happen), `too_late`, `not_found`, or the store's word."""
        check_id(task_id)
        target = target or await self._target_of(task_id)
        if target is None:
            return Outcome("not_found", task_id, f"no delayed task with id {task_id!r}")
        status = await self.tasks.cancel(task_id, target)
        return Outcome(status, task_id, _explain(status, task_id))

    async def reschedule(self, task_id: str, due: datetime, target: str | None = None) -> Outcome:
        """Move a pending task to `due`: `rescheduled`, `too_late`, `not_found`, or the store's."""
        check_id(task_id)
        self.check_due(due)
        target = target or await self._target_of(task_id)
        if target is None:
            return Outcome("not_found", task_id, f"no delayed task with id {task_id!r}")
        status, ref = await self.tasks.reschedule(task_id, target, due)
        if ref is None:
            return Outcome(status, task_id, _explain(status, task_id))
        await self.notify_leader(ref)
        return Outcome(status, task_id, data={"due_at": to_rfc3339_us(ceil_ms(due))})  # as stored

    def check_due(self, due: datetime) -> None:
        try:  # a time PostgreSQL or the engine's arithmetic cannot hold (year 1, year 9999)
            bounded_instant(due)
        except ValueError as exc:
            raise RequestError("bad_request", f"delay_until: {exc}", "delay_until") from None
        if due - self.clock.now() > self.settings.max_delay:
            raise RequestError(
                "too_far",
                f"delay_until: more than {self.settings.max_delay.days} days ahead "
                "(SCHEDULER_MAX_DELAY)",
                "delay_until",
            )

    async def notify_leader(self, ref: TaskRef) -> None:
        """Offer a task to the leader's heap at once (whichever instance leads), under its
        organisation (scheduler.engine.delayed.rescheduled)."""
        await self.bus.notify(rescheduled.SUBJECT, rescheduled.encode(ref))

    async def _target_of(self, task_id: str) -> str | None:
        """The stored task's target, else the one noted when the API or the `schedule` verb
        put it on the delay lane (scheduler.store.postgres.lane_notes), on any instance."""
        task = await self.tasks.get(task_id)
        return await self.tasks.lane_target(task_id) if task is None else str(task["target"])


def _json_object(payload: bytes) -> dict[str, Any] | None:
    """The stored bytes as a JSON object, None when they are not one."""
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def check_id(task_id: str) -> None:
    """RequestError (`bad_request`, field `id`) unless `task_id` follows the envelope's id rule:
    an id no envelope can carry is never looked up or stored as an intent."""
    if not valid_id(task_id):
        raise RequestError("bad_request", f"id: {ID_RULE}", "id")


def _fired_key(cursor: str | None) -> list[Any] | None:
    """The key of a cursor that continues among fired tasks, None for any other cursor."""
    if cursor is None or kind_of(cursor) != FIRED_CURSOR:
        return None
    return decode(FIRED_CURSOR, cursor, (TIME, TASK_ID))


_WHY = {
    "too_late": "the task is already firing or done; nothing was changed",
    "in_flight": "the task's publish is in flight (its acknowledgement is in doubt); "
    "it may or may not be delivered, so nothing was changed",
    "id_contended": "a cancel or reschedule for another target waits for a task with this id "
    "on the delay lane; nothing was changed: ask again once your task was taken off the lane",
    "too_many_intents": "this target already has SCHEDULER_INTENT_MAX_PER_TARGET cancels or "
    "reschedules waiting for tasks not yet taken off the delay lane; nothing was recorded",
    "too_many_intents_org": "the organisation this target names already has "
    "SCHEDULER_INTENT_MAX_PER_ORG cancels or reschedules waiting for tasks not yet taken off "
    "the delay lane; nothing was recorded",
    "too_many_intents_total": "the scheduler already holds SCHEDULER_INTENT_MAX_TOTAL cancels "
    "or reschedules waiting for tasks not yet taken off the delay lane; nothing was recorded",
}


def _explain(status: str, task_id: str) -> str:
    if status == "not_found":
        return f"no delayed task with id {task_id!r}"
    return _WHY.get(status, "")
