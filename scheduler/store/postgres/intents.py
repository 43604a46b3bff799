"""Cancel and reschedule intents: a cancel (or reschedule) that arrives before its task.

A producer that holds its PubAck may cancel its task while the task still sits on the delay
lane, not yet taken by intake. Such a cancel stores an *intent* (migration 0016): a row of
`delayed_messages` with status `intent`, the id, the target the cancel named, `intent` =
`cancel` or `reschedule` (to `due_at`), lapsing at `expires_at` (SCHEDULER_INTENT_TTL).

**One atomic point.** Intent and task share the row keyed by the task's id, so the race between
intake storing the task and the cancel recording its intent is decided by the primary key:
- intake first: the cancel's `INSERT ... ON CONFLICT (id) DO UPDATE` meets the task's row
  (waiting for intake's transaction to commit if it has not) and cancels it like any pending
  task (`cancelled`), or answers what the row says (`too_late`, ...);
- cancel first: intake's insert meets the intent (waiting likewise) and honours it
  (`TaskStore.insert`): a cancel intent stores the task `cancelled` (never delivered), a
  reschedule intent stores it pending at the new time.
Never two reads that could both miss.

**Targets.** An intent acts only on a task of the target it names (NATS permissions on
`scheduler.v1.cancel.<rest>` bound whose tasks a caller may touch): a task of another target
that arrives with the same id replaces the intent and is stored as sent. A cancel that meets a
live intent of another target answers `id_contended` (nothing changed; ask again once the task
was taken off the lane), never `not_found`.

**Bounds.** An intent lives SCHEDULER_INTENT_TTL (default 24 h) and is purged after it; a
target holds at most SCHEDULER_INTENT_MAX_PER_TARGET live intents, an organisation (the one its
target names, `mq.org.<org>.>`, kept in the intent's `org_id`) at most
SCHEDULER_INTENT_MAX_PER_ORG over all its targets, and the deployment at most
SCHEDULER_INTENT_MAX_TOTAL: past any of them a cancel of an id not stored answers
`too_many_intents` naming the bound (nothing recorded). Ids follow the envelope's rule (1-200
printable ASCII characters), so storage grows by at most the total's worth of small rows, each
gone after the TTL. Each count reads a partial index and stops at its bound (~95 ns a live
intent here: ~19 ms at 200,000, hence the total's default of 100,000); an organisation or the
total found full is not counted again for FULL_FOR (1 s) by that process (`SeenFull`), so a
flood at the bound costs PostgreSQL nothing per refusal, at the price of a refusal up to 1 s
stale.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from scheduler.messages.subjects import org_of
from scheduler.settings import Settings
from scheduler.store.postgres import task_states as states

INTENT = "intent"
CONTENDED = "id_contended"
TOO_MANY = "too_many_intents"  # the target's bound; the organisation's and the total's:
TOO_MANY_ORG = "too_many_intents_org"
TOO_MANY_TOTAL = "too_many_intents_total"
REFUSALS = (TOO_MANY, TOO_MANY_ORG, TOO_MANY_TOTAL)

# What makes an intent live for the task that meets it (the same target, not expired) is
# written once, in the function `scheduler_intake_insert` of migration 0019, which intake's
# insert calls: a change to the rule is a new migration.


@dataclass(frozen=True, slots=True)
class IntentLimits:
    """How long an intent lives, and how many one target, one organisation and all may hold."""

    ttl: timedelta = timedelta(hours=24)
    max_per_target: int = 10_000
    max_per_org: int = 50_000
    max_total: int = 100_000

    @classmethod
    def from_settings(cls, settings: Settings) -> IntentLimits:
        """The limits SCHEDULER_INTENT_TTL and SCHEDULER_INTENT_MAX_* set."""
        return cls(
            settings.intent_ttl,
            settings.intent_max_per_target,
            settings.intent_max_per_org,
            settings.intent_max_total,
        )


_PENDING = states.unclaimed(states.PENDING, "d")  # a task a cancel or reschedule may still change
# The intent row: no payload, due at its expiry (a cancel) or at the new time (a reschedule).
_INSERT = (
    "INSERT INTO delayed_messages AS d (id, target, payload, due_at, scheduled_for, "
    "expires_at, status, intent, org_id) SELECT $1, $2, ''::bytea, {due}, {due}, "
    "now() + $3::interval, 'intent', '{kind}', {org} "
    "WHERE NOT EXISTS (SELECT 1 FROM fired_tasks WHERE id = $1) "
    "ON CONFLICT (id) DO UPDATE SET "
)
_CANCEL = _INSERT.format(due="now() + $3::interval", kind="cancel", org="$4::text") + (
    "status = CASE WHEN d.status = 'intent' THEN 'intent' ELSE 'cancelled' END, "
    "intent = CASE WHEN d.status = 'intent' THEN 'cancel' ELSE d.intent END, "
    "expires_at = CASE WHEN d.status = 'intent' THEN excluded.expires_at ELSE d.expires_at END, "
    f"updated_at = now() WHERE d.target = excluded.target AND ({_PENDING} OR "
    "d.status = 'intent') RETURNING d.status"
)
_RESCHEDULE = _INSERT.format(due="$4::timestamptz", kind="reschedule", org="$5::text") + (
    "due_at = excluded.due_at, scheduled_for = excluded.scheduled_for, "
    "intent = CASE WHEN d.status = 'intent' THEN 'reschedule' ELSE d.intent END, "
    "expires_at = CASE WHEN d.status = 'intent' THEN excluded.expires_at ELSE d.expires_at END, "
    f"updated_at = now() WHERE d.target = excluded.target AND ({_PENDING} OR "
    "d.status = 'intent' AND (d.intent = 'reschedule' OR "
    "d.expires_at <= now())) RETURNING d.id, d.due_at, d.priority, d.seq, d.org_id, d.status"
)


_COUNT = (
    "SELECT count(*) FROM (SELECT 1 FROM delayed_messages WHERE status = 'intent' AND {scope} "
    "expires_at > now() LIMIT $1) AS i"
)
_BY_TARGET = _COUNT.format(scope="target = $2 AND")
_BY_ORG = _COUNT.format(scope="org_id = $2 AND")
_ALL = _COUNT.format(scope="")


async def at_limit(conn: asyncpg.Connection, target: str, limits: IntentLimits) -> str | None:
    """The refusal (`TOO_MANY`, `TOO_MANY_ORG`, `TOO_MANY_TOTAL`) of one more intent of
    `target` when a bound is reached, else None; each count reads a partial index and stops
    at its bound, the narrowest first."""
    if await conn.fetchval(_BY_TARGET, limits.max_per_target, target) >= limits.max_per_target:
        return TOO_MANY
    org = org_of(target)
    if org is not None and await conn.fetchval(_BY_ORG, limits.max_per_org, org) >= (
        limits.max_per_org
    ):
        return TOO_MANY_ORG
    if await conn.fetchval(_ALL, limits.max_total) >= limits.max_total:
        return TOO_MANY_TOTAL
    return None


FULL_FOR = 1.0  # seconds a bound found full is taken as full without counting again


class SeenFull:
    """The organisations, and the total (key None), found at their bound in the last
    FULL_FOR seconds (monotonic clock), by this process."""

    def __init__(self) -> None:
        self._until: dict[str | None, float] = {}

    def refusal(self, target: str) -> str | None:
        now = time.monotonic()
        if self._until.get(None, 0.0) > now:
            return TOO_MANY_TOTAL
        org = org_of(target)
        if org is not None and self._until.get(org, 0.0) > now:
            return TOO_MANY_ORG
        return None

    def saw(self, target: str, refusal: str | None) -> None:
        now = time.monotonic()
        if refusal in (TOO_MANY_ORG, TOO_MANY_TOTAL):
            self._until = {k: t for k, t in self._until.items() if t > now}  # stays small
            key = org_of(target) if refusal == TOO_MANY_ORG else None
            self._until[key] = now + FULL_FOR


async def refusal(
    conn: asyncpg.Connection, target: str, limits: IntentLimits, seen: SeenFull
) -> str | None:
    """`at_limit`, answered from `seen` while a bound it found full is fresh."""
    cached = seen.refusal(target)
    if cached is not None:
        return cached  # not recorded again: a bound is counted at least every FULL_FOR
    refused = await at_limit(conn, target, limits)
    seen.saw(target, refused)
    return refused


async def record_cancel(
    conn: asyncpg.Connection, task_id: str, target: str, limits: IntentLimits
) -> str | None:
    """Cancel the pending task `task_id` of `target` or record a cancel intent for it, in one
    statement; the row's status after it (`cancelled` or `intent`), None if it changed
    nothing. Run inside a transaction (see `drop_if_fired`)."""
    async with conn.transaction():
        status: str | None = await conn.fetchval(
            _CANCEL, task_id, target, limits.ttl, org_of(target)
        )
        if status == INTENT and await drop_if_fired(conn, task_id):
            return None
    return status


async def record_reschedule(
    conn: asyncpg.Connection, task_id: str, target: str, due: datetime, limits: IntentLimits
) -> asyncpg.Record | None:
    """Move the pending task `task_id` of `target` to `due` or record a reschedule intent, in
    one statement; the row (its `status` says which), None if it changed nothing."""
    async with conn.transaction():
        row = await conn.fetchrow(_RESCHEDULE, task_id, target, limits.ttl, due, org_of(target))
        if row is not None and row["status"] == INTENT and await drop_if_fired(conn, task_id):
            return None
    return row


async def drop_if_fired(conn: asyncpg.Connection, task_id: str) -> bool:
    """Delete the intent just recorded when the id has a tombstone (the task fired).

    A second statement, like the tombstone check in intake's `scheduler_intake_insert`
    (migration 0019): the intent's insert may have waited on the unique index for a
    `mark_fired` deleting the task's row, whose tombstone its snapshot could not see; this
    statement's snapshot does."""
    gone = await conn.fetchval(
        "DELETE FROM delayed_messages d USING fired_tasks f WHERE d.id = $1 AND "
        "d.status = 'intent' AND f.id = d.id RETURNING d.id",
        task_id,
    )
    return gone is not None


async def contended(conn: asyncpg.Connection, task_id: str, target: str) -> bool:
    """Whether a live intent of another target holds `task_id`."""
    held = await conn.fetchval(
        "SELECT 1 FROM delayed_messages WHERE id = $1 AND status = 'intent' AND target <> $2 "
        "AND expires_at > now()",
        task_id,
        target,
    )
    return held is not None


async def purge(conn: asyncpg.Connection) -> int:
    """Delete the intents past their time; returns how many."""
    done = await conn.execute(
        "DELETE FROM delayed_messages WHERE status = 'intent' AND expires_at <= now()"
    )
    return int(done.split()[-1])
