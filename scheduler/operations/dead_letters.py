"""Dead letters for operators: list, show, resolve, replay one, replay a filtered batch.

A replay goes back through the normal path, never around it, and re-checks the target against
`SCHEDULER_TARGET_ALLOW` as it is configured now:

- **Firing stage** (a task whose publish failed `SCHEDULER_MAX_ATTEMPTS` times): the task goes
  back to `pending` with the same id, attempts from zero and due now (see
  `DeadLetterStore.requeue`); the leader claims and publishes it as any other, with
  `Nats-Msg-Id` = the task id, so the target stream's duplicate window also drops a repeat.
- **Intake stage** (bad input that never became a task): the stored bytes are validated again as
  the intake would, and only if they now pass are they published to the delay lane again (with
  `Nats-Msg-Id` `replay:<dead letter id>`); the intake stores a task id once (`ON CONFLICT DO
  NOTHING`), and a replay of an id that is already a task is refused.

A dead letter is replayed at most once (`replayed_at`); a replayed task that dies again makes a
new dead letter. An intake refusal stored cut to `SCHEDULER_DEAD_LETTER_PAYLOAD_CAP` bytes is
not replayed (`payload_truncated`, naming the DLQ stream subject that holds the whole copy).
"""

from __future__ import annotations

import base64
import builtins
import logging
import uuid
from typing import Any

from scheduler.clock import Clock
from scheduler.errors import EnvelopeError, TargetRefusedError
from scheduler.messages.envelope import Limits, check_org, parse_envelope
from scheduler.messages.subjects import check_target, delay_lane_prefix, dlq_subject
from scheduler.operations import Outcome
from scheduler.operations.dead_letter_records import DeadLetterDetail, DeadLetterSummary
from scheduler.operations.paging import (
    DEAD_ID,
    TIME,
    Page,
    bad_cursor,
    decode,
    from_us,
    page,
    us,
)
from scheduler.operations.ports import PUBLISH_TIMEOUT, BusWriter, WriteFailed
from scheduler.operations.stores import DeadLetterFilter, DeadLetters
from scheduler.operations.tasks import TaskOperations
from scheduler.records import ceil_ms
from scheduler.settings import Settings

log = logging.getLogger(__name__)

CURSOR = "dead-letters"


class DeadLetterOperations:
    def __init__(
        self,
        bus: BusWriter,
        settings: Settings,
        store: DeadLetters,
        tasks: TaskOperations,
        clock: Clock,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.store = store
        self.tasks = tasks
        self.clock = clock

    async def list(
        self, where: DeadLetterFilter, cursor: str | None, limit: int
    ) -> Page[DeadLetterSummary]:
        key = decode(CURSOR, cursor, (TIME, DEAD_ID))
        after = None
        if key is not None:
            after = (from_us(key[0]), _uuid(key[1]))
        rows = await self.store.list(where, after, limit + 1)
        found = [DeadLetterSummary.model_validate(row) for row in rows]
        return page(found, limit, lambda d: (us(d.last_failed), str(d.id)), CURSOR)

    async def show(self, dead_id: uuid.UUID) -> DeadLetterDetail | None:
        row = await self.store.get(dead_id)
        return None if row is None else _detail(row)

    async def resolve(
        self, dead_id: uuid.UUID, resolved: bool, who: str
    ) -> DeadLetterDetail | None:
        """Mark resolved (or open again); None when there is no such dead letter."""
        row = await self.store.resolve(dead_id, resolved, who)
        return None if row is None else _detail(row)

    async def replay(self, dead_id: uuid.UUID, who: str) -> Outcome:
        """Replay one dead letter: `replayed`, or why not (a status and a detail)."""
        dead = await self.store.get(dead_id)
        ident = str(dead_id)
        if dead is None:
            return Outcome("not_found", ident, f"no dead letter with id {ident}")
        if dead["replayed_at"] is not None:
            return Outcome("already_replayed", ident, f"replayed at {dead['replayed_at']}")
        target = dead["target"] or dead["subject"]
        try:
            check_target(target, self.settings.target_allow)
        except TargetRefusedError as exc:
            return Outcome("target_refused", ident, f"{exc} (SCHEDULER_TARGET_ALLOW)")
        if dead["stage"] == "intake":
            return await self._through_intake(dead, target, who)
        return await self._requeue(dead, who)

    async def replay_many(
        self, where: DeadLetterFilter, limit: int, who: str
    ) -> builtins.list[Outcome]:  # `list` is the method above
        """Replay up to `limit` unresolved dead letters matching `where`, newest first."""
        unresolved = DeadLetterFilter(where.reason, where.subject, where.stage, resolved=False)
        rows = await self.store.list(unresolved, None, limit)
        return [await self.replay(row["id"], who) for row in rows]

    async def _requeue(self, dead: dict[str, Any], who: str) -> Outcome:
        ident, task_id = str(dead["id"]), dead["original_id"]
        task = await self.tasks.get(task_id)
        if task is None:  # the task row is gone: its stored bytes go through the intake again
            return await self._through_intake(dead, dead["target"] or dead["subject"], who)
        now = self.clock.now()
        if task.expires_at is not None and task.expires_at <= now:
            detail = f"task {task_id}'s ttl ran out at {task.expires_at}; it would expire"
            return Outcome("expired", ident, detail)
        done = await self.store.requeue(dead["id"], task_id, ceil_ms(now), who)  # whole ms
        if done.status != "replayed" or done.ref is None:
            detail = f"task {task_id} is {done.task_status}" if done.task_status else ""
            return Outcome(done.status, ident, detail, {"task_id": task_id})
        await self.tasks.notify_leader(done.ref)
        return Outcome("replayed", ident, data={"task_id": task_id, "via": "firing"})

    async def _through_intake(self, dead: dict[str, Any], target: str, who: str) -> Outcome:
        ident, raw = str(dead["id"]), dead["raw"]
        if raw is None:
            return Outcome("not_replayable", ident, "the dead letter kept no message bytes")
        if dead.get("raw_truncated"):
            return Outcome("payload_truncated", ident, self._truncated(dead))
        limits = Limits(max_payload=self.bus.max_payload, max_delay=self.settings.max_delay)
        try:
            env = parse_envelope(raw, self.clock.now(), limits)
            check_org(env, target)
        except EnvelopeError as exc:
            return Outcome("still_invalid", ident, f"{exc} (fix the producer and publish again)")
        existing = await self.tasks.get(env.id)
        if existing is not None:
            detail = f"task {env.id} already exists ({existing.status}); nothing to replay"
            return Outcome("duplicate", ident, detail, {"task_id": env.id})
        if not await self.store.mark_replayed(dead["id"], who):
            return Outcome("already_replayed", ident)
        subject = delay_lane_prefix(self.settings.intake_subject) + target[len("mq.") :]
        headers = {k: v for k, v in (dead["headers"] or {}).items() if not _is_nats(k)}
        # Not the envelope id: the producer's own publish used it, and the lane's duplicate
        # window would drop the replay. A dead letter is replayed once, so this id is too;
        # the intake stores a task id once whatever the message id.
        headers["Nats-Msg-Id"] = f"replay:{ident}"
        try:
            await self.bus.store(subject, raw, headers, PUBLISH_TIMEOUT)
        except WriteFailed as exc:
            await self.store.unmark_replayed(dead["id"])
            log.warning("dead_letter.replay_failed id=%s error=%r", ident, exc)
            detail = f"publishing to {subject} failed ({exc}); retry shortly"
            return Outcome("publish_failed", ident, detail)
        return Outcome("replayed", ident, data={"task_id": env.id, "via": "intake"})

    def _truncated(self, dead: dict[str, Any]) -> str:
        """Why a cut dead letter is not replayed, and where its whole copy is."""
        where = dlq_subject(dead["target"], self.settings.dlq_subject_prefix)
        return (
            f"only the first {len(dead['raw'])} of the message's {dead['raw_size']} bytes were "
            "kept (SCHEDULER_DEAD_LETTER_PAYLOAD_CAP); the whole message is on stream "
            f"{self.settings.dlq_stream}, subject {where}, for SCHEDULER_DLQ_MAX_AGE after it "
            "failed: publish it from there once fixed"
        )


def _detail(row: dict[str, Any]) -> DeadLetterDetail:
    """A stored dead letter (`DeadLetterStore.get`) as answered: its bytes in base64."""
    raw: bytes | None = row["raw"]
    encoded = None if raw is None else base64.b64encode(raw).decode()
    return DeadLetterDetail.model_validate(row | {"raw_base64": encoded})


def _is_nats(header: str) -> bool:
    return header.lower().startswith("nats-")


def _uuid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise bad_cursor() from None
