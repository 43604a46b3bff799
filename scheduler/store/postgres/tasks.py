"""Delayed tasks in PostgreSQL: intake, loading in firing order, claim, outcome, cancel, reschedule.

Every state change a leader makes (claim, fired, retry, expire, dead) runs in a *fenced*
transaction: it first reads the fencing epoch `FOR SHARE` and aborts with FencedError when a newer
leader has taken office. `FOR SHARE` also makes a new leader's epoch increment wait for such a
transaction in flight, so once `take_office` returns no older epoch can commit anything.

A claim leaves `status` alone (migration 0013): a `pending` or `in_doubt` row is claimed while
`claimed_epoch` is set, so the claim changes no indexed column and no column of an index
predicate, and PostgreSQL updates the row in place on its page (a heap-only tuple, no index
entry; the table keeps room for it, `fillfactor = 45`). Readers report such a row as `claimed`
(`STATUS`). `status = 'claimed'` is left only on rows a daemon older than 0013 claimed (while an
upgrade rolls): `reclaim_orphans` takes them over like any orphan. That rule, and every
predicate built on it, lives in scheduler.store.postgres.task_states.

A task whose publish went out but was never acknowledged is `in_doubt`: JetStream may hold it.
It is due again after a backoff (the leader republishes it with the same `Nats-Msg-Id`, which
the target stream's duplicate window drops if it was stored), and until then a cancel or a
reschedule answers `in_flight`, never `cancelled`: a `cancelled` answer is never followed by a
delivery. The loader reads `pending` and `in_doubt` tasks alike, in firing order.

Claims and reclaims return payloads only up to a byte budget (a running sum over the rows the
statement touched): rows past it come back without their payload, claimed all the same, and
are fetched later (`load_claimed`), so one statement never pulls more than the budget into
memory whatever producers sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from scheduler.errors import FencedError
from scheduler.messages.headers import printable
from scheduler.records import (
    Claimed,
    ClaimedTask,
    Fired,
    Insertion,
    NewTask,
    TaskRef,
    ceil_ms,
    firing_order,
    from_ms,
    to_ms,
)
from scheduler.store.postgres import intents
from scheduler.store.postgres import task_states as states
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.epoch import LEAD, check_epoch
from scheduler.store.postgres.intents import LIVE, IntentLimits
from scheduler.store.postgres.values import ROW_ERRORS

log = logging.getLogger("scheduler.store")

ANALYZE_AFTER_ROWS = 20_000
_TASK_COLUMNS = (
    "id, target, payload, headers, priority, due_at, scheduled_for, expires_at, attempts, seq, "
    "doubted, org_id"
)
# The status rule (scheduler.store.postgres.task_states), under the names this module always had:
READY = states.READY  # statuses a claim takes; each has its partial index
CLAIMED = states.claimed()  # a row claimed by a leader, or by a daemon older than 0013
STATUS = states.reported()  # the status every reader reports for a row
# A claim takes only tasks due within this much of PostgreSQL's now(), so every claimed row
# falls due before now() + CLAIM_WINDOW and `reclaim_orphans` reads the ready indexes up to
# there only (the engine claims 80-250 ms ahead).
CLAIM_WINDOW = "interval '1 minute'"
IN_FLIGHT = "in_flight"  # what cancel and reschedule answer for a task in doubt
# Payload columns within a byte budget: the rows of `upd` (which must return `_TASK_COLUMNS`
# and `size`) in firing order; a row whose predecessors already fill the budget comes back
# with a NULL payload.
_BUDGETED = (
    "SELECT u.id, u.target, CASE WHEN u.run - u.size < {budget} THEN u.payload END AS payload, "
    "u.headers, u.priority, u.due_at, u.scheduled_for, u.expires_at, u.attempts, u.seq, "
    "u.doubted, u.org_id FROM "
    "(SELECT upd.*, sum(upd.size) OVER (ORDER BY upd.due_at, upd.priority, upd.seq) AS run "
    "FROM upd) AS u"
)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


# Large batches pass text columns as one string split in SQL and instants as integer
# microseconds: asyncpg encodes a text[] element in 0.6 us and a timestamptz[] one in 1.3 us,
# a joined string in a tenth of that. The separator (ASCII unit separator) cannot occur in a
# task id (printable ASCII), a subject or a stream name; `_joined` checks anyway.
_SEP = "\x1f"
_SEP_SQL = "chr(31)"
_EPOCH_US = "'1970-01-01T00:00:00Z'::timestamptz"
_ONE_US = "interval '1 microsecond'"


def _joined(values: list[str]) -> str | None:
    """`values` joined by the separator, or None when one of them is empty or holds it."""
    text = _SEP.join(values)
    if text.count(_SEP) != len(values) - 1 or not all(values):
        return None
    return text


def _us(dt: datetime) -> int:
    """Microseconds since the epoch, exactly."""
    return (dt - _EPOCH) // _MICROSECOND


_NO_HEADERS: dict[str, str] = {}  # shared by every task without headers; never mutated


def _claimed_of(rows: Iterable[asyncpg.Record]) -> Claimed:
    """The tasks of claimed rows, those with their payload `ready`, the rest `parked`, each
    list in firing order."""
    ready: list[ClaimedTask] = []
    parked: list[ClaimedTask] = []
    for r in rows:
        (ready if r["payload"] is not None else parked).append(_claimed(r))
    order = firing_order
    return Claimed(sorted(ready, key=order), sorted(parked, key=order))


def _claimed(row: asyncpg.Record) -> ClaimedTask:
    headers = row["headers"]
    payload = row["payload"] or b""
    return ClaimedTask(
        id=row["id"],
        target=row["target"],
        payload=payload if type(payload) is bytes else bytes(payload),
        headers=_NO_HEADERS if headers == "{}" else json.loads(headers),
        priority=row["priority"],
        due_at=row["due_at"],
        scheduled_for=row["scheduled_for"],
        expires_at=row["expires_at"],
        attempts=row["attempts"],
        seq=row["seq"],
        doubted=row["doubted"],
        org_id=row["org_id"],
    )


def _ref(row: asyncpg.Record) -> TaskRef:
    return TaskRef(row["id"], to_ms(row["due_at"]), row["priority"], row["seq"], row["org_id"])


_TOO_LATE: dict[str | None, str] = {None: "not_found", "in_doubt": IN_FLIGHT}
_INTENT_ANSWERS = (intents.CONTENDED, intents.TOO_MANY)
RACE_RETRIES = 3  # see _update_or_status


async def _answer_status(conn: asyncpg.Connection, task_id: str, target: str) -> str | None:
    """The status a cancel or reschedule that changed nothing reports on: `in_doubt` also for
    a task being republished after a doubt (claimed again: it may already be delivered)."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        f"SELECT coalesce((SELECT CASE WHEN {CLAIMED} AND doubted THEN 'in_doubt' "
        f"ELSE {STATUS} END FROM delayed_messages WHERE id = $1 AND target = $2), "
        "(SELECT 'fired' FROM fired_tasks WHERE id = $1 AND target = $2))",
        task_id,
        target,
    )


async def _update_or_status(
    conn: asyncpg.Connection, update: str, task_id: str, target: str, *args: Any
) -> tuple[asyncpg.Record | None, str | None]:
    """Run a cancel's or reschedule's `update` of the pending task (`$1` id, `$2` target):
    its row, or, when it changed nothing, the status to answer from (`_answer_status`).

    The UPDATE can miss a task intake commits just after it, which the status read then sees
    `pending`: the UPDATE runs again (once is enough; intake cannot store the same id twice)."""
    status: str | None = None
    for _ in range(RACE_RETRIES):
        row = await conn.fetchrow(update, task_id, target, *args)
        if row is not None:
            return row, None
        status = await _answer_status(conn, task_id, target)
        if status != "pending":
            break
    return None, status


async def _drop_fired(conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> list[asyncpg.Record]:
    """The rows just inserted minus those whose id has a tombstone (it fired): these are
    deleted again, in the insert's transaction, and judged as conflicts by the caller.

    A second statement, not a `NOT EXISTS` in the insert: it takes a new snapshot, so it also
    sees a tombstone committed while the insert ran. The insert waits on the unique index for
    a concurrent `mark_fired` deleting the same id to commit, so every such tombstone is
    committed before this statement starts; a check inside the insert's own snapshot would
    miss it and store the id again."""
    fired = await conn.fetch(
        "WITH t AS (SELECT id FROM fired_tasks WHERE id = ANY($1::text[])) "
        "DELETE FROM delayed_messages d USING t WHERE d.id = t.id RETURNING d.id",
        [r["id"] for r in rows],
    )
    if not fired:
        return rows
    gone = {r["id"] for r in fired}
    return [r for r in rows if r["id"] not in gone]


def _first_of(tasks: Sequence[NewTask], ids: set[str]) -> list[NewTask]:
    """The first task of `tasks` with each id of `ids`."""
    left, out = set(ids), []
    for task in tasks:
        if task.id in left:
            left.discard(task.id)
            out.append(task)
    return out


# What intake's insert does when the id is held: a row that is an intent (never a task) is
# taken over by the task, honouring the intent when it is live and names the task's target
# (a cancel stores it `cancelled`, a reschedule at the new time), replaced otherwise; any
# other row is left alone (the caller judges the conflict).
_TAKE_INTENT = (
    "ON CONFLICT (id) DO UPDATE SET target = excluded.target, payload = excluded.payload, "
    "headers = excluded.headers, priority = excluded.priority, org_id = excluded.org_id, "
    "expires_at = excluded.expires_at, seq = excluded.seq, created_at = now(), "
    f"updated_at = now(), status = CASE WHEN {LIVE} AND d.intent = 'cancel' "
    "THEN 'cancelled' ELSE 'pending' END, "
    f"due_at = CASE WHEN {LIVE} AND d.intent = 'reschedule' THEN d.due_at "
    "ELSE excluded.due_at END, "
    f"scheduled_for = CASE WHEN {LIVE} AND d.intent = 'reschedule' THEN d.scheduled_for "
    f"ELSE excluded.scheduled_for END, intent = CASE WHEN {LIVE} THEN d.intent END "
    "WHERE d.status = 'intent'"
)


def _intake_row(r: dict[str, Any], reduced: bool = False) -> tuple[Any, ...]:
    """The values of one intake dead letter, every text PostgreSQL-safe."""
    headers = {printable(k): printable(v) for k, v in (r["headers"] or {}).items()}
    size = r.get("raw_size", len(r["raw"]))
    return (
        printable(r["original_id"], 200),
        printable(r["subject"]),
        printable(r["error"]),
        r["reason"],
        None if r["target"] is None else printable(r["target"]),
        r["raw"],
        "{}" if reduced else json.dumps(headers),
        r.get("key"),
        size,
        size > len(r["raw"]),
    )


# The state of a fired task, whose row is gone: its tombstone and latest delivery. The fields
# only the row held (priority, expiry, creation) are unknown (None).
_FIRED = (
    "SELECT t.id, t.target, 'fired' AS status, NULL::smallint AS priority, "
    "coalesce(f.scheduled_for, t.fired_at) AS due_at, "
    "coalesce(f.scheduled_for, t.fired_at) AS scheduled_for, NULL::timestamptz AS expires_at, "
    "coalesce(f.attempt, 1) AS attempts, t.fired_at, f.stream_seq, NULL::text AS last_error, "
    "NULL::timestamptz AS created_at FROM fired_tasks t LEFT JOIN LATERAL (SELECT "
    "scheduled_for, attempt, stream_seq FROM fire_log WHERE kind = 'delayed' AND key = t.id "
    "ORDER BY fired_at DESC LIMIT 1) f ON true WHERE t.id = $1 AND ($2::text IS NULL OR "
    "t.target = $2)"
)


async def fired_task(
    conn: asyncpg.Connection, task_id: str, target: str | None = None
) -> dict[str, Any] | None:
    """A fired task's state (see `_FIRED`), None when `task_id` has no tombstone."""
    row = await conn.fetchrow(_FIRED, task_id, target)
    return None if row is None else dict(row)


class TaskStore:
    """Statements on `delayed_messages`, `fire_log` and `dead_letters`."""

    def __init__(self, db: PostgresStore, intent_limits: IntentLimits | None = None) -> None:
        self.db = db
        self.intent_limits = intent_limits or IntentLimits()
        self.inserted = 0  # rows this store has inserted (see `analyze_if_stale`)
        self._analyzed_at_rows = 0  # `inserted` at the last ANALYZE, and its row estimate
        self._rows_at_analyze = 0
        self._analyze_allowed = True

    @asynccontextmanager
    async def fenced(self, epoch: int, op: str) -> AsyncIterator[asyncpg.Connection]:
        """A transaction that aborts with FencedError unless `epoch` is the current one."""
        async with self.db.timed(op) as conn, conn.transaction():
            await check_epoch(conn, epoch)
            yield conn

    async def insert(self, tasks: Sequence[NewTask]) -> list[TaskRef]:
        """Store a batch in one round trip; a task id seen before is stored once (no error)."""
        return (await self._insert(tasks))[0]

    async def _insert(self, tasks: Sequence[NewTask]) -> tuple[list[TaskRef], set[str]]:
        """Store a batch in one round trip: the refs of the tasks stored to fire, and the ids
        of those stored cancelled because a cancel intent awaited them
        (scheduler.store.postgres.intents:
        a task meeting its target's live intent takes over the intent's row, honouring it; a
        task meeting another target's intent replaces it). Within the batch, the first task
        with an id is the one offered (ON CONFLICT DO UPDATE may touch a row once)."""
        if not tasks:
            return [], set()
        unique = {t.id for t in tasks}
        if len(unique) < len(tasks):  # rare (a producer's resend in the same batch): copy only then
            tasks = _first_of(tasks, unique)
        ids, targets = [t.id for t in tasks], [t.target for t in tasks]
        joined = (_joined(ids), _joined(targets))
        texts: tuple[str | list[str], ...]
        if None in joined:  # a separator or an empty value inside: plain arrays
            texts, (a, b) = (ids, targets), ("$1::text[]", "$2::text[]")
        else:
            texts = tuple(t for t in joined if t is not None)
            a, b = (f"string_to_array(${n}, {_SEP_SQL})" for n in (1, 2))
        async with self.db.timed("insert") as conn, conn.transaction():
            rows = await conn.fetch(
                "INSERT INTO delayed_messages AS d (id, target, payload, headers, priority, "
                "due_at, scheduled_for, expires_at, org_id) SELECT u.id, u.target, u.payload, "
                f"u.headers, u.priority, {_EPOCH_US} + u.due_us * {_ONE_US}, "
                f"{_EPOCH_US} + u.sched_us * {_ONE_US}, {_EPOCH_US} + u.exp_us * {_ONE_US}, "
                f"u.org_id FROM unnest({a}, {b}, $3::bytea[], $4::jsonb[], $5::smallint[], "
                "$6::bigint[], $7::bigint[], $8::bigint[], $9::text[]) "
                "AS u(id, target, payload, headers, priority, due_us, sched_us, exp_us, org_id) "
                f"{_TAKE_INTENT} RETURNING id, due_at, priority, seq, org_id, status",
                texts[0],
                texts[1],
                [t.payload for t in tasks],
                [json.dumps(t.headers) if t.headers else "{}" for t in tasks],
                [t.priority for t in tasks],
                [_us(t.due_at) for t in tasks],
                [_us(t.scheduled_for) for t in tasks],
                [None if t.expires_at is None else _us(t.expires_at) for t in tasks],
                [t.org_id for t in tasks],
            )
            rows = await _drop_fired(conn, rows) if rows else rows
        self.inserted += len(rows)
        cancelled = {r["id"] for r in rows if r["status"] == "cancelled"}
        return [_ref(r) for r in rows if r["status"] != "cancelled"], cancelled

    async def insert_batch(self, tasks: Sequence[NewTask]) -> Insertion:
        """Store a batch, judging each task alone: an id seen before is a no-op when it is the
        same task (same target, same bytes) and `taken` otherwise; a row PostgreSQL refuses is
        split out of the batch (halving it until found) and `refused`, the rest stored."""
        try:
            refs, cancelled = await self._insert(tasks)
        except ROW_ERRORS as exc:
            if len(tasks) == 1:
                log.warning("insert.refused id=%s error=%s", tasks[0].id, exc)
                return Insertion(refused=[(tasks[0], f"PostgreSQL refused it: {exc}")])
            half = len(tasks) // 2
            first = await self.insert_batch(tasks[:half])
            return first.extend(await self.insert_batch(tasks[half:]))
        result = Insertion(stored=refs)
        fresh = {r.task_id for r in refs} | cancelled
        if len(fresh) < len(tasks):
            await self._judge_conflicts(tasks, fresh, result)
        if cancelled:
            result.cancelled = _first_of(tasks, cancelled)
        return result

    async def _judge_conflicts(
        self, tasks: Sequence[NewTask], stored: set[str], result: Insertion
    ) -> None:
        """Sort the tasks not stored into exact resends and ids taken by another task, the
        row or, for a task that fired, its tombstone (target and digest of the bytes) being
        the one compared."""
        fresh = set(stored)
        conflicts = []
        for task in tasks:  # within a batch, the first task with an id is the one stored
            if task.id in fresh:
                fresh.discard(task.id)
            else:
                conflicts.append(task)
        async with self.db.timed("conflicts") as conn:
            rows = await conn.fetch(
                "SELECT u.i, CASE WHEN d.id IS NOT NULL THEN d.target = u.target AND "
                "d.payload = u.payload WHEN f.id IS NOT NULL THEN f.target = u.target AND "
                "f.digest = md5(u.payload)::uuid ELSE true END AS same "
                "FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int[]) "
                "AS u(id, target, payload, i) LEFT JOIN delayed_messages d ON d.id = u.id "
                "LEFT JOIN fired_tasks f ON d.id IS NULL AND f.id = u.id",
                [t.id for t in conflicts],
                [t.target for t in conflicts],
                [t.payload for t in conflicts],
                list(range(len(conflicts))),
            )
        for row in rows:
            task = conflicts[row["i"]]
            (result.resent if row["same"] else result.taken).append(task)

    async def load_page(
        self, after: tuple[int, int, int], until: datetime, limit: int
    ) -> list[TaskRef]:
        """Pending and in-doubt tasks not claimed with key > `after` due by `until`, in firing
        order (each status from its partial index, merged)."""
        due_ms, priority, seq = after
        page = (
            "(SELECT id, due_at, priority, seq, org_id FROM delayed_messages WHERE {} "
            "AND (due_at, priority, seq) > ($1, $2, $3) "
            "AND due_at <= $4 ORDER BY due_at, priority, seq LIMIT $5)"
        )
        pending, doubted = (page.format(states.unclaimed(s)) for s in states.READY_STATUSES)
        async with self.db.timed("load") as conn:
            rows = await conn.fetch(
                f"SELECT * FROM ({pending} UNION ALL "
                f"{doubted}) AS p ORDER BY due_at, priority, seq LIMIT $5",
                from_ms(max(due_ms, 0)) if due_ms >= 0 else datetime(1970, 1, 1, tzinfo=UTC),
                priority,
                min(seq, 2**62),
                until,
                limit,
            )
        return [_ref(r) for r in rows]

    async def overdue(self, before: datetime, limit: int) -> list[TaskRef]:
        """Ready tasks not claimed due before `before`: the sweep that catches anything the heap
        missed. Each status from its partial index, merged (`status IN (...)` in one query
        read the whole table: 70 ms at 300,000 tasks, every sweep)."""
        page = (
            "(SELECT id, due_at, priority, seq, org_id FROM delayed_messages WHERE {} "
            "AND due_at < $1 ORDER BY due_at, priority, seq LIMIT $2)"
        )
        pending, doubted = (page.format(states.unclaimed(s)) for s in states.READY_STATUSES)
        async with self.db.timed("sweep") as conn:
            rows = await conn.fetch(
                f"SELECT * FROM ({pending} UNION ALL "
                f"{doubted}) AS p ORDER BY due_at, priority, seq LIMIT $2",
                before,
                limit,
            )
        return [_ref(r) for r in rows]

    async def claim(self, epoch: int, ids: Sequence[str], until: datetime) -> list[ClaimedTask]:
        """`claim_within` without a byte budget: every claimed task with its payload."""
        return (await self.claim_within(epoch, ids, until, 2**62)).ready

    async def claim_within(
        self, epoch: int, ids: Sequence[str], until: datetime, budget: int
    ) -> Claimed:
        """Claim the pending and in-doubt tasks among `ids` due by `until` (and within
        CLAIM_WINDOW of PostgreSQL's now()); cancelled and claimed ones are skipped. Payloads
        come back up to `budget` bytes (see the module docstring).

        One statement, one round trip: the epoch check (`FOR SHARE`) and the update commit
        together. The outer join always yields a row, so a fenced epoch is told apart from
        an empty claim. It sets no indexed column: a HOT update (migration 0013)."""
        budgeted = _BUDGETED.format(budget="$4")
        async with self.db.timed("claim") as conn:
            rows = await conn.fetch(
                f"WITH {LEAD}, "
                f"upd AS (UPDATE delayed_messages SET {states.claim('$1')}, "
                "attempts = attempts + 1, updated_at = now() FROM lead WHERE id = ANY($2::text[]) "
                f"AND {states.ready_unclaimed()} AND due_at <= least($3, now() "
                f"+ {CLAIM_WINDOW}) RETURNING {_TASK_COLUMNS}, "
                "octet_length(payload) AS size) "
                "SELECT (SELECT count(*) FROM lead) AS in_office, b.* "
                f"FROM (SELECT 1) AS one LEFT JOIN ({budgeted}) AS b ON true",
                epoch,
                list(ids),
                until,
                budget,
            )
        if not rows or rows[0]["in_office"] == 0:
            raise FencedError(epoch)
        return _claimed_of(r for r in rows if r["id"] is not None)

    async def reclaim_orphans(
        self,
        epoch: int,
        stale: timedelta | None = None,
        limit: int = 1000,
        budget: int = 2**62,
    ) -> Claimed:
        """Take over up to `limit` claimed tasks never marked fired, in firing order, to
        publish them again: those of earlier leaders and, with `stale`, any claim older than
        that, this leader's own included (a claim whose reply was lost in an outage). Paged:
        each page is one short statement, whatever the number of orphans; a task taken over
        no longer matches, so calling again gives the next page. Payloads up to `budget`.

        Claimed rows have no index of their own (a claim is a HOT update, migration 0013), but
        every one falls due before now() + CLAIM_WINDOW (`claim_within` takes no later task),
        so the page is read from the ready indexes up to there only, however long ago the
        oldest orphan fell due, never the tasks due later. Rows a daemon older than 0013 left
        `claimed` come from the claimed index and go back to their ready status here.

        The page's ids are looked up by primary key (`= ANY(ARRAY(...))`), never joined: with
        statistics taken while few tasks were claimed, the planner's nested-loop join of the
        page against the claimed rows cost 38,000 x 1,000 comparisons per call during a
        200,000-task burst (seconds of PostgreSQL CPU, every sweep)."""
        budgeted = _BUDGETED.format(budget="$4")
        orphan = states.orphaned("$1", "$2::interval")
        branch = (
            "(SELECT id, due_at, priority, seq FROM delayed_messages WHERE {} AND "
            f"{orphan} ORDER BY due_at, priority, seq LIMIT $3)"
        )
        window = f"due_at <= now() + {CLAIM_WINDOW}"
        picks = " UNION ALL ".join(
            branch.format(where)
            for where in (
                *(f"{states.claimed_as(s)} AND {window}" for s in states.READY_STATUSES),
                states.legacy_claimed(),  # left by a daemon older than migration 0013
            )
        )
        async with self.fenced(epoch, "reclaim") as conn:
            rows = await conn.fetch(
                f"WITH pick AS (SELECT id FROM ({picks}) AS p ORDER BY due_at, priority, seq "
                f"LIMIT $3), upd AS (UPDATE delayed_messages d SET status = {states.reclaimed('d')}"
                f", {states.claim('$1')}, updated_at = now() "
                f"WHERE d.id = ANY(ARRAY(SELECT id FROM pick)) AND {states.claimed('d')} RETURNING "
                f"d.id, d.target, d.payload, d.headers, d.priority, d.due_at, d.scheduled_for, "
                "d.expires_at, d.attempts, d.seq, d.doubted, d.org_id, "
                "octet_length(d.payload) AS size) "
                f"{budgeted}",
                epoch,
                stale,
                limit,
                budget,
            )
        return _claimed_of(rows)

    async def load_claimed(self, epoch: int, ids: Sequence[str], budget: int) -> Claimed:
        """The payloads of tasks this leader claimed but took without them (over a budget),
        in firing order, again up to `budget` bytes; tasks no longer claimed by `epoch` (a
        newer leader took them) are left out."""
        budgeted = _BUDGETED.format(budget="$3")
        async with self.db.timed("load_claimed") as conn:
            rows = await conn.fetch(
                f"WITH upd AS (SELECT {_TASK_COLUMNS}, octet_length(payload) AS size FROM "
                f"delayed_messages WHERE id = ANY($2::text[]) AND {states.claimed_by('$1')}) "
                f"{budgeted}",
                epoch,
                list(ids),
                budget,
            )
        return _claimed_of(rows)

    async def current_epoch(self) -> int:
        """The fencing epoch PostgreSQL holds now (a leader compares it with its own)."""
        async with self.db.timed("epoch") as conn:
            return int(await conn.fetchval("SELECT epoch FROM leadership WHERE id = 1"))

    async def mark_fired(self, epoch: int, fired: Sequence[Fired], instance: str) -> None:
        """Record deliveries in one statement: each task's row deleted, a tombstone in
        `fired_tasks` (its id stays refused for the retention, migration 0010) and one
        `fire_log` row.

        Idempotent: tombstone and log row are written only for a task this statement deletes
        while claimed by `epoch`, which happens once per task (one row per task and attempt),
        and the unique index `fire_log_once` drops an exact repeat of a row (migration 0006)."""
        if not fired:
            return
        columns = (
            [f.task.id for f in fired],
            [f.task.target for f in fired],
            [f.stream for f in fired],
        )
        joined = [_joined(c) for c in columns]
        texts: tuple[str | list[str], ...]
        if None in joined:  # a separator or an empty value inside: plain arrays
            texts, (a, b, c) = columns, ("$3::text[]", "$4::text[]", "$8::text[]")
        else:
            texts = tuple(t for t in joined if t is not None)
            a, b, c = (f"string_to_array(${n}, {_SEP_SQL})" for n in (3, 4, 8))
        async with self.db.timed("fired") as conn:
            in_office = await conn.fetchval(
                f"WITH {LEAD}, "
                f"u AS (SELECT u.id, u.subject, {_EPOCH_US} + u.sched_us * "
                f"{_ONE_US} AS sched, {_EPOCH_US} + u.fired_us * {_ONE_US} AS fired_at, "
                f"u.attempt, u.stream, u.seq FROM unnest({a}, {b}, $5::bigint[], "
                f"$6::bigint[], $7::int[], {c}, $9::bigint[]) "
                "AS u(id, subject, sched_us, fired_us, attempt, stream, seq)), "
                "upd AS (DELETE FROM delayed_messages d USING u, lead WHERE d.id = u.id AND "
                f"{states.claimed_by('$1', 'd')} RETURNING d.id, d.target, "
                "md5(d.payload)::uuid AS digest, u.fired_at), "
                "tomb AS (INSERT INTO fired_tasks (id, target, digest, fired_at) SELECT id, "
                "target, digest, fired_at FROM upd ON CONFLICT (id) DO NOTHING), "
                "ins AS (INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, "
                "attempt, epoch, instance, stream, stream_seq) SELECT 'delayed', u.id, "
                "u.subject, u.sched, u.fired_at, u.attempt, $1, $2, u.stream, u.seq "
                "FROM u JOIN upd ON upd.id = u.id ON CONFLICT DO NOTHING RETURNING 1) "
                "SELECT count(*) FROM lead",
                epoch,
                instance,
                texts[0],
                texts[1],
                [_us(f.task.scheduled_for) for f in fired],
                [_us(f.fired_at) for f in fired],
                [f.task.attempts for f in fired],
                texts[2],
                [f.stream_seq for f in fired],
            )
        if in_office == 0:
            raise FencedError(epoch)

    async def retry_later(
        self, epoch: int, items: Sequence[tuple[ClaimedTask, datetime, str, bool]]
    ) -> None:
        """Put failed publishes back with a later due time and the error text: `pending` when
        the message was certainly not stored, `in_doubt` (the last item) when it went out
        unacknowledged, and for good once a task has been in doubt (`doubted`)."""
        if not items:
            return
        async with self.fenced(epoch, "retry") as conn:
            await conn.execute(
                "UPDATE delayed_messages d SET status = "
                f"{states.ready_again('d.doubted OR u.doubt')}, doubted = d.doubted OR u.doubt, "
                f"due_at = u.due, {states.UNCLAIM}, last_error = u.err, updated_at = now() FROM "
                "unnest($2::text[], $3::timestamptz[], $4::text[], $5::boolean[]) "
                f"AS u(id, due, err, doubt) WHERE d.id = u.id AND {states.claimed_by('$1', 'd')}",
                epoch,
                [t.id for t, _, _, _ in items],
                [d for _, d, _, _ in items],
                [e for _, _, e, _ in items],
                [doubt for _, _, _, doubt in items],
            )

    async def expire(self, epoch: int, ids: Sequence[str]) -> None:
        """Mark claimed tasks expired: past `timestamp + ttl_seconds`, never delivered."""
        if not ids:
            return
        async with self.fenced(epoch, "expire") as conn:
            await conn.execute(
                "UPDATE delayed_messages SET status = 'expired', updated_at = now() "
                f"WHERE id = ANY($2::text[]) AND {states.claimed_by('$1')}",
                epoch,
                list(ids),
            )

    async def kill(self, epoch: int, items: Sequence[tuple[ClaimedTask, str, str]]) -> None:
        """Dead-letter claimed tasks: status dead plus a `dead_letters` row with the error."""
        if not items:
            return
        async with self.fenced(epoch, "dead") as conn:
            await conn.execute(
                "WITH u AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[]) "
                "AS u(id, err, reason)), d AS (UPDATE delayed_messages m "
                "SET status = 'dead', last_error = u.err, updated_at = now() FROM u "
                f"WHERE m.id = u.id AND {states.claimed_by('$1', 'm')} "
                "RETURNING m.*, u.err, u.reason) "
                # the task's bytes once, whole (a task fits max_payload), in `raw`
                "INSERT INTO dead_letters (original_id, subject, payload, error, attempts, "
                "first_seen, reason, stage, target, raw, headers, raw_size) SELECT id, target, "
                "'null', err, attempts, created_at, reason, 'firing', target, payload, headers, "
                "octet_length(payload) FROM d",
                epoch,
                [t.id for t, _, _ in items],
                [printable(e) for _, e, _ in items],
                [r for _, _, r in items],
            )

    async def record_bad_intake(self, rows: Sequence[dict[str, Any]]) -> None:
        """Dead-letter rows for intake messages that were never tasks (bad input).

        Each row: `original_id`, `subject`, `error`, `reason`, `target` (text, made safe for
        PostgreSQL here), `raw` (the bytes; `payload` is derived from them), `headers` and
        `key` (the message on the lane: recorded once, a redelivery adds nothing). A row
        PostgreSQL still refuses is stored again without its payload document and headers."""
        if not rows:
            return
        try:
            await self._dead_intake([_intake_row(r) for r in rows])
        except ROW_ERRORS:
            for r in rows:  # rare: find the row, keep the others whole
                try:
                    await self._dead_intake([_intake_row(r)])
                except ROW_ERRORS as exc:
                    log.warning("dead_intake.reduced id=%s error=%s", r["original_id"], exc)
                    await self._dead_intake([_intake_row(r, reduced=True)])

    async def _dead_intake(self, rows: list[tuple[Any, ...]]) -> None:
        async with self.db.timed("dead_intake") as conn:
            await conn.executemany(
                # the bytes once, in `raw` (migration 0014): `payload` is JSON null
                "INSERT INTO dead_letters (original_id, subject, payload, error, attempts, "
                "first_seen, reason, stage, target, raw, headers, intake_key, raw_size, "
                "raw_truncated) VALUES ($1, $2, 'null', $3, 1, now(), $4, 'intake', $5, $6, "
                "$7::jsonb, $8, $9, $10) ON CONFLICT (intake_key) DO NOTHING",
                rows,
            )

    async def cancel(self, task_id: str, target: str) -> str:
        """`cancelled` (now or before, or an intent recorded for a task not yet taken off the
        delay lane), `in_flight` (published, acknowledgement outstanding: it may be
        delivered), `too_late` (claimed or done), `id_contended` or `too_many_intents`
        (scheduler.store.postgres.intents; nothing changed).

        A claim racing the cancel either commits first (the cancel then waits on the row lock,
        re-checks its `WHERE` on the claimed row, changes nothing and answers `too_late`) or
        waits for the cancel and skips the cancelled row: `cancelled` is never followed by a
        delivery. Intake racing it: see scheduler.store.postgres.intents."""
        async with self.db.timed("cancel") as conn:
            done, status = await _update_or_status(
                conn,
                "UPDATE delayed_messages SET status = 'cancelled', updated_at = now() "
                f"WHERE id = $1 AND target = $2 AND {states.unclaimed(states.PENDING)} "
                "RETURNING id",
                task_id,
                target,
            )
            if done is not None:
                return "cancelled"
            if status is None or status == intents.INTENT:
                status = await self._cancel_ahead(conn, task_id, target, status)
        if status in ("cancelled", intents.INTENT):
            return "cancelled"
        return status if status in _INTENT_ANSWERS else _TOO_LATE.get(status, "too_late")

    async def _cancel_ahead(
        self, conn: asyncpg.Connection, task_id: str, target: str, status: str | None
    ) -> str | None:
        """Cancel `task_id` of `target` whatever arrives first, the task or this cancel
        (scheduler.store.postgres.intents); the status to answer from."""
        limits = self.intent_limits
        if status is None and await intents.at_limit(conn, target, limits):
            return intents.TOO_MANY
        got = await intents.record_cancel(conn, task_id, target, limits)
        return got or await self._why_not(conn, task_id, target)

    async def _why_not(self, conn: asyncpg.Connection, task_id: str, target: str) -> str | None:
        """The status of a task an intent could not be recorded for."""
        status = await _answer_status(conn, task_id, target)
        if status is None and await intents.contended(conn, task_id, target):
            return intents.CONTENDED
        return status

    async def reschedule(
        self, task_id: str, target: str, due: datetime
    ) -> tuple[str, TaskRef | None]:
        """Move a pending task to `due`: `rescheduled` (+ its heap ref; no ref when an intent
        was recorded for a task not yet taken off the lane), `in_flight` (in doubt: it may
        have been delivered, so it is never moved), `too_late`, `not_found` never, or
        `id_contended` / `too_many_intents` (see `cancel`)."""
        due = ceil_ms(due)
        async with self.db.timed("reschedule") as conn:
            row, status = await _update_or_status(
                conn,
                "UPDATE delayed_messages SET due_at = $3, scheduled_for = $3, updated_at = now() "
                f"WHERE id = $1 AND target = $2 AND {states.unclaimed(states.PENDING)} "
                "RETURNING id, due_at, priority, seq, org_id",
                task_id,
                target,
                due,
            )
            if row:
                return "rescheduled", _ref(row)
            if status is None or status == intents.INTENT:
                return await self._reschedule_ahead(conn, task_id, target, due, status)
        return _TOO_LATE.get(status, "too_late"), None

    async def _reschedule_ahead(
        self, conn: asyncpg.Connection, task_id: str, target: str, due: datetime, status: str | None
    ) -> tuple[str, TaskRef | None]:
        """Reschedule `task_id` of `target` whatever arrives first (see `_cancel_ahead`)."""
        limits = self.intent_limits
        if status is None and await intents.at_limit(conn, target, limits):
            return intents.TOO_MANY, None
        row = await intents.record_reschedule(conn, task_id, target, due, limits)
        if row is None:
            why = await self._why_not(conn, task_id, target)
            return (why if why in _INTENT_ANSWERS else _TOO_LATE.get(why, "too_late")), None
        if row["status"] == intents.INTENT:
            return "rescheduled", None
        return "rescheduled", _ref(row)

    async def get(self, task_id: str, target: str | None = None) -> dict[str, Any] | None:
        """A task's state for the API (no payload bytes)."""
        async with self.db.timed("get") as conn:
            row = await conn.fetchrow(
                f"SELECT id, target, {STATUS} AS status, priority, due_at, scheduled_for, "
                "expires_at, attempts, fired_at, stream_seq, last_error, created_at "
                "FROM delayed_messages "
                "WHERE id = $1 AND ($2::text IS NULL OR target = $2)",
                task_id,
                target,
            )
            if row is None:
                return await fired_task(conn, task_id, target)
        return dict(row)

    async def analyze_if_stale(self, min_rows: int = ANALYZE_AFTER_ROWS) -> bool:
        """ANALYZE `delayed_messages` when this store has inserted many rows since the last one.

        Autovacuum looks at a table once a minute; until then a table filled by a burst keeps
        the statistics of its empty self, and the claim's `id = ANY(...)` is planned as a scan
        of every due row through the pending index instead of primary-key lookups (17 ms
        instead of 1.5 ms per 1,000 claimed among 100,000 due, growing with the burst).
        Returns whether it ran; a database user that may not ANALYZE is told once."""
        grown = self.inserted - self._analyzed_at_rows
        if not self._analyze_allowed or grown < max(min_rows, self._rows_at_analyze // 2):
            return False
        try:
            async with self.db.timed("analyze") as conn:
                await conn.execute("ANALYZE delayed_messages")
                estimate = await conn.fetchval(
                    "SELECT reltuples::bigint FROM pg_class "
                    "WHERE oid = 'delayed_messages'::regclass"
                )
        except asyncpg.InsufficientPrivilegeError as exc:
            self._analyze_allowed = False
            log.warning("postgres.analyze_refused error=%s (autovacuum keeps the statistics)", exc)
            return False
        self._analyzed_at_rows = self.inserted
        self._rows_at_analyze = max(int(estimate or 0), 0)
        return True

    async def pending_count(self) -> int:
        """Pending and in-doubt tasks not claimed: all of them (an index-only scan of
        `delayed_messages_org_open`) less the claimed ones, found among those due within
        CLAIM_WINDOW (a filter on `claimed_epoch` over the whole table read every row)."""
        claimed = " - ".join(
            f"(SELECT count(*) FROM delayed_messages WHERE {states.claimed_as(s)} "
            f"AND due_at <= now() + {CLAIM_WINDOW})"
            for s in states.READY_STATUSES
        )
        async with self.db.timed("count") as conn:
            return int(
                await conn.fetchval(
                    f"SELECT (SELECT count(*) FROM delayed_messages WHERE {states.ready()}) - "
                    f"{claimed}"
                )
            )

    async def pending_by_org(self) -> dict[str | None, int]:
        """Unfinished tasks (pending, in doubt, claimed) per `org_id` over the partial index
        `delayed_messages_org_open` (claimed tasks keep their status since migration 0013),
        plus the rows a daemon older than 0013 left `claimed` (none once it is gone) over
        the claimed index."""
        async with self.db.timed("count_orgs") as conn:
            rows = await conn.fetch(
                "SELECT org_id, sum(n)::bigint AS n FROM (SELECT org_id, count(*) AS n FROM "
                f"delayed_messages WHERE {states.ready()} GROUP BY org_id "
                "UNION ALL SELECT org_id, count(*) FROM delayed_messages "
                f"WHERE {states.legacy_claimed()} GROUP BY org_id) AS c GROUP BY org_id"
            )
        return {r["org_id"]: r["n"] for r in rows}

    async def purge_finished(self, retention_days: int) -> int:
        """Delete cancelled and expired tasks older than the retention (and fired ones a
        daemon older than migration 0010 left), and the tombstones of tasks that fired before
        it: their ids may be used again. Returns the rows deleted from both tables."""
        async with self.db.timed("purge") as conn:
            status = await conn.execute(
                "DELETE FROM delayed_messages WHERE status IN ('fired', 'cancelled', 'expired') "
                "AND updated_at < now() - make_interval(days => $1)",
                retention_days,
            )
            tombs = await conn.execute(
                "DELETE FROM fired_tasks WHERE fired_at < now() - make_interval(days => $1)",
                retention_days,
            )
            lapsed = await intents.purge(conn)
        return int(status.split()[-1]) + int(tombs.split()[-1]) + lapsed
