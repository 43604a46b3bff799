"""Delayed tasks in PostgreSQL, the engine's statements (`scheduler.engine.ports.TaskRepository`):
intake (scheduler.store.postgres.task_intake), then here loading in firing order, claim, and the
outcome (fired, retry, expire, dead). The operators' statements (cancel, reschedule, a task's
state) are scheduler.store.postgres.task_admin.

Every state change a leader makes (claim, fired, retry, expire, dead) is one statement fenced by
its epoch over its tasks' partitions (`scheduler.store.postgres.epoch.fenced`; a task's
partition is `partition_of(id, P)`, and each row joins `lead` on its stored `partition`): it
changes nothing and raises FencedError once a newer leader has taken office over one of them,
and a new leader's epoch increment waits for such a statement in flight, so once `take_office`
returns no older epoch of its partitions can commit anything.

A claim leaves `status` alone (migration 0013): a `pending` or `in_doubt` row is claimed while
`claimed_epoch` is set, so the claim changes no indexed column and no column of an index
predicate, and PostgreSQL updates the row in place on its page (a heap-only tuple, no index
entry; the table keeps room for it, `fillfactor = 45`). Readers report such a row as `claimed`.
`status = 'claimed'` is left only on rows a daemon older than 0013 claimed (while an upgrade
rolls): `reclaim_orphans` takes them over like any orphan. That rule, and every predicate built
on it, lives in scheduler.store.postgres.task_states.

A task whose publish went out but was never acknowledged is `in_doubt`: JetStream may hold it.
It is due again after a backoff (the leader republishes it with the same `Nats-Msg-Id`, which
the target stream's duplicate window drops if it was stored). The loader reads `pending` and
`in_doubt` tasks alike, in firing order.

**The outcomes' plans.** An outcome (fired, retry, dead) joins an array of task ids, `u`, with
`delayed_messages` and checks that each row is still claimed by the epoch. The statistics say
next to nothing is claimed: ANALYZE almost always samples a table at rest, when few or no rows
hold a `claimed_epoch`. Written as `claimed_epoch = $1`, that estimate made the planner scan
the claimed rows and join them to `u` by a rescan of `u` for each row. After a takeover or a
burst, with 40,000 rows claimed, one booking of 5,000 then ran for over 60 s. The check
therefore compares with `u.epoch`, a column of `u` set to `$1`, and `u` is MATERIALIZED, so
the planner cannot fold the constant back in. It then joins by the primary key (`u` outer) or
by a hash, whatever the statistics say: the same booking takes 0.13 s
(test_task_store.py's `test_outcomes_read_their_ids_once_whatever_the_statistics_say` explains
all three statements over such a table). Since each row's partition is checked against the
office (`d.partition = lead.partition`), statistics taken while the table was nearly empty let
a plan read every ready task and join them to `lead` first; so an outcome also names its ids
to the primary key (`BY_IDS_OF_U`), and a test explains the three statements under such
statistics (`test_outcomes_read_their_rows_by_id_when_the_statistics_saw_an_empty_table`).
Both hold only for a plan made with the statement's own arrays: a prepared statement's generic
plan (kept after five executions) estimates every array at 10 elements and rescanned `u` per
row all the same (a booking of 800: 200 ms). So outcomes run with `custom_plan` (each
prepared afresh, see `epoch.fenced`).

Claims and reclaims return payloads only up to a byte budget (a running sum over the rows the
statement touched): rows past it come back without their payload, claimed all the same, and
are fetched later (`load_claimed`), so one statement never pulls more than the budget into
memory whatever producers sent.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg

from scheduler.messages.headers import printable
from scheduler.partitions import partition_of
from scheduler.records import (
    Claimed,
    ClaimedTask,
    Fired,
    TaskRef,
    from_ms,
)
from scheduler.store.postgres import task_states as states
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.epoch import OFFICE_OF_ONE, fenced, fenced_by
from scheduler.store.postgres.intents import IntentLimits
from scheduler.store.postgres.partitioning import EACH_OF
from scheduler.store.postgres.task_admin import TaskAdmin
from scheduler.store.postgres.task_intake import TaskIntake
from scheduler.store.postgres.task_rows import (
    EPOCH_US,
    ONE_US,
    SEP_SQL,
    claimed_of,
    joined,
    micros,
    task_ref,
)

_TASK_COLUMNS = (
    "id, target, payload, headers, priority, due_at, scheduled_for, expires_at, attempts, seq, "
    "doubted, org_id"
)
# A claim takes only tasks due within this much of PostgreSQL's now(), so every claimed row
# falls due before now() + CLAIM_WINDOW and `reclaim_orphans` reads the ready indexes up to
# there only (the engine claims 80-250 ms ahead).
CLAIM_WINDOW = "interval '1 minute'"
# At most this many deliveries a booking statement: a statement's time and locks stay bounded
# whatever a burst's flush holds. One of 20,000 once did not finish in 30 s; the cause was the
# rescan the module docstring describes ("The outcomes' plans"), whose work grows with the
# statement's size; 5,000 take 0.12-0.19 s, 10,000 0.21 s (tables of 300,000 and 1,000,000).
FIRED_CHUNK = 5_000
# How an outcome (fired, retry, dead) finds its rows: by the primary key, the ids of `u` as one
# array (an InitPlan) in the index condition, beside the join on `u`. Without it, statistics
# taken while the table was nearly empty let the planner read every ready task through
# another index, join them to `lead` on the partition and rescan `u` for each (4,068 rows read
# and 528,710 join candidates for one booking of 130, 38-44 ms against 4 ms; the partition
# join came with step 1 of issue 37, and PostgreSQL's share of a side-by-side run rose 60 %).
# `row` is the alias of `delayed_messages` in the statement.
BY_IDS_OF_U = "{row}.id = ANY(ARRAY(SELECT id FROM u)) AND {row}.id = u.id"
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


def _ready_by_partition(where: str, limit: str, owned: str) -> str:
    """Unclaimed pending and in-doubt tasks matching `where` of the partitions `owned` (an
    array parameter), in firing order, at most `limit`: for each partition, each status's
    range of its index (partition, due_at, priority, seq), merged."""
    page = (
        "(SELECT id, due_at, priority, seq, org_id FROM delayed_messages WHERE {} "
        f"AND partition = o.part AND {where} ORDER BY due_at, priority, seq LIMIT {limit})"
    )
    pending, doubted = (page.format(states.unclaimed(s)) for s in states.READY_STATUSES)
    return (
        f"SELECT p.* FROM {EACH_OF.format(owned)} CROSS JOIN LATERAL ({pending} UNION ALL "
        f"{doubted}) AS p ORDER BY p.due_at, p.priority, p.seq LIMIT {limit}"
    )


def _ready_each(where: str, each: str, owned: str) -> str:
    """As `_ready_by_partition`, but at most `each` of each partition's status range, all of
    them in firing order with the range they came from (`part`, `doubted_range`), for
    `_complete_prefix` to cut where a range may have more."""
    page = (
        "(SELECT id, due_at, priority, seq, org_id, {} AS doubted_range FROM delayed_messages "
        f"WHERE {{}} AND partition = o.part AND {where} ORDER BY due_at, priority, seq "
        f"LIMIT {each})"
    )
    pending, doubted = (
        page.format(flag, states.unclaimed(s))
        for flag, s in zip(("false", "true"), states.READY_STATUSES, strict=True)
    )
    return (
        f"SELECT o.part, p.* FROM {EACH_OF.format(owned)} CROSS JOIN LATERAL ({pending} "
        f"UNION ALL {doubted}) AS p ORDER BY p.due_at, p.priority, p.seq"
    )


# The loader's page: after the key ($1, $2, $3), due by $4, at most $5, of the partitions $6.
LOAD_SQL = _ready_by_partition(
    "(due_at, priority, seq) > ($1, $2, $3) AND due_at <= $4", "$5", "$6"
)
# The sweep's page: due before $1, at most $2, of the partitions $3.
SWEEP_SQL = _ready_by_partition("due_at < $1", "$2", "$3")
# The same with at most $5 (loader) or $2 (sweep) of each partition's range, cut by the caller
LOAD_EACH_SQL = _ready_each("(due_at, priority, seq) > ($1, $2, $3) AND due_at <= $4", "$5", "$6")
SWEEP_EACH_SQL = _ready_each("due_at < $1", "$2", "$3")
# Over several partitions a page reads at most this share of its limit from each partition's
# range (at least EACH_MIN), not the whole limit from each (the partition ownership record's
# Consequences, docs/decisions/): partitions are hashes of ids, so a page's tasks are
# spread over them, and a skewed page is read again whole.
EACH_SHARE = 2
EACH_MIN = 16


def _each_of(limit: int, owned: int) -> int:
    """How many tasks of each partition's range a page of `limit` over `owned` reads."""
    return max(EACH_MIN, -(-limit * EACH_SHARE // owned))


def _complete_prefix(rows: list[asyncpg.Record], each: int) -> tuple[list[TaskRef], bool]:
    """The rows (in firing order) up to the first key past which a range read only `each`
    rows may hold more: every ready task of the office up to there is among them. True when
    the rows were cut so."""
    counts: dict[tuple[int, bool], int] = {}
    last: dict[tuple[int, bool], tuple[datetime, int, int]] = {}
    for r in rows:
        range_of = (r["part"], r["doubted_range"])
        counts[range_of] = counts.get(range_of, 0) + 1
        last[range_of] = (r["due_at"], r["priority"], r["seq"])
    full = [last[k] for k, n in counts.items() if n >= each]
    if not full:
        return [task_ref(r) for r in rows], False
    cut = min(full)
    return [task_ref(r) for r in rows if (r["due_at"], r["priority"], r["seq"]) <= cut], True


class TaskStore(TaskIntake, TaskAdmin):
    """The engine's statements on `delayed_messages`, `fire_log` and `dead_letters`: intake's
    (`TaskIntake`), then loading, claims and outcomes here.

    It is a `TaskAdmin` as well, so one store serves a test (and the contract suite that holds
    the in-memory twin to it) with the operators' statements too; the daemon hands
    scheduler.operations a `TaskAdmin` of the management API's pool."""

    def __init__(
        self, db: PostgresStore, intent_limits: IntentLimits | None = None, partitions: int = 1
    ) -> None:
        TaskIntake.__init__(self, db, partitions)
        TaskAdmin.__init__(self, db, intent_limits)
        # the partitions the engine's term holds: every one under P = 1; under P > 1 the
        # daemon sets it at each term (leadership.partitioned, `on_term`)
        self.office: Sequence[int] = range(partitions)

    def _partitions_of(self, ids: Iterable[str]) -> Collection[int]:
        """The partitions a write to tasks `ids` is fenced by: each task's (its row holds
        `partition_of(id, P)`, intake stored it so), or the whole office when there are none."""
        if self.partitions == 1:
            return OFFICE_OF_ONE
        return {partition_of(i, self.partitions) for i in ids} or self.office

    async def load_page(
        self,
        after: tuple[int, int, int],
        until: datetime,
        limit: int,
        partitions: Collection[int] | None = None,
    ) -> list[TaskRef]:
        """Pending and in-doubt tasks of the office's partitions (or of `partitions`, a term's
        gain read back) not claimed with key > `after` due by `until`, in firing order (each
        partition and status from its partial index by partition, merged)."""
        due_ms, priority, seq = after
        start = from_ms(max(due_ms, 0)) if due_ms >= 0 else datetime(1970, 1, 1, tzinfo=UTC)
        key = (start, priority, min(seq, 2**62), until)
        office = sorted(self.office if partitions is None else partitions)
        each = _each_of(limit, len(office))
        async with self.db.timed("load") as conn:
            if each < limit:  # several partitions: a share of the page from each, first
                rows = await conn.fetch(LOAD_EACH_SQL, *key, each, office)
                page, cut = _complete_prefix(rows, each)
                if not cut or len(page) >= limit:
                    return page[:limit]
            rows = await conn.fetch(LOAD_SQL, *key, limit, office)  # skewed: the whole page
        return [task_ref(r) for r in rows]

    async def overdue(self, before: datetime, limit: int) -> list[TaskRef]:
        """Ready tasks not claimed due before `before`: the sweep that catches anything the heap
        missed. Each status from its partial index, merged (`status IN (...)` in one query
        read the whole table: 70 ms at 300,000 tasks, every sweep)."""
        office = list(self.office)
        each = _each_of(limit, len(office))
        async with self.db.timed("sweep") as conn:
            if each < limit:  # several partitions: what a share of each gives in order is enough
                rows = await conn.fetch(SWEEP_EACH_SQL, before, each, office)
                return _complete_prefix(rows, each)[0][:limit]
            rows = await conn.fetch(SWEEP_SQL, before, limit, office)
        return [task_ref(r) for r in rows]

    async def claim_within(
        self, epoch: int, ids: Sequence[str], until: datetime, budget: int
    ) -> Claimed:
        """Claim the pending and in-doubt tasks among `ids` due by `until` (and within
        CLAIM_WINDOW of PostgreSQL's now()); cancelled and claimed ones are skipped. Payloads
        come back up to `budget` bytes (see the module docstring).

        One fenced statement, one round trip. It sets no indexed column: a HOT update
        (migration 0013)."""
        async with self.db.timed("claim") as conn:
            rows = await fenced(
                conn,
                epoch,
                f"upd AS (UPDATE delayed_messages SET {states.claim('$1')}, "
                "attempts = attempts + 1, updated_at = now() FROM lead WHERE id = ANY($2::text[]) "
                "AND delayed_messages.partition = lead.partition "
                f"AND {states.ready_unclaimed()} AND due_at <= least($3, now() "
                f"+ {CLAIM_WINDOW}) RETURNING {_TASK_COLUMNS}, "
                "octet_length(payload) AS size)",
                list(ids),
                until,
                budget,
                rows=_BUDGETED.format(budget="$4"),
                **fenced_by(self._partitions_of(ids), self.office),
            )
        return claimed_of(rows)

    async def reclaim_orphans(
        self,
        epoch: int,
        stale: timedelta | None = None,
        limit: int = 1000,
        budget: int = 2**62,
        partitions: Collection[int] | None = None,
    ) -> Claimed:
        """Take over up to `limit` claimed tasks never marked fired, in firing order, to
        publish them again: those of earlier leaders and, with `stale`, any claim older than
        that, this leader's own included (a claim whose reply was lost in an outage); in the
        office's partitions, or in `partitions` (some of them) when given. Paged:
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
        parts = list(self.office if partitions is None else partitions)
        orphan = states.orphaned("$1", "$2::interval")
        branch = (
            "(SELECT id, due_at, priority, seq FROM delayed_messages WHERE {} AND "
            f"partition = o.part AND {orphan} ORDER BY due_at, priority, seq LIMIT $3)"
        )
        window = f"due_at <= now() + {CLAIM_WINDOW}"
        picks = " UNION ALL ".join(
            branch.format(where)
            for where in (
                *(f"{states.claimed_as(s)} AND {window}" for s in states.READY_STATUSES),
                states.legacy_claimed(),  # left by a daemon older than migration 0013
            )
        )
        async with self.db.timed("reclaim") as conn:
            rows = await fenced(
                conn,
                epoch,
                f"pick AS (SELECT p.id FROM {EACH_OF.format('$5')} CROSS JOIN LATERAL ({picks}) "
                "AS p ORDER BY p.due_at, p.priority, p.seq LIMIT $3), upd AS (UPDATE "
                f"delayed_messages d SET status = {states.reclaimed('d')}, "
                f"{states.claim('$1')}, updated_at = now() FROM lead "
                "WHERE d.id = ANY(ARRAY(SELECT id FROM pick)) AND d.partition = lead.partition "
                f"AND {states.claimed('d')} RETURNING "
                f"d.id, d.target, d.payload, d.headers, d.priority, d.due_at, d.scheduled_for, "
                "d.expires_at, d.attempts, d.seq, d.doubted, d.org_id, "
                "octet_length(d.payload) AS size)",
                stale,
                limit,
                budget,
                parts,
                rows=_BUDGETED.format(budget="$4"),
                **fenced_by(parts, self.office),
            )
        return claimed_of(rows)

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
        return claimed_of(rows)

    async def current_epoch(self) -> int:
        """The fencing epoch PostgreSQL holds now over the office (a leader compares it with
        its own): the one every partition of it holds, or -1 when they differ (a partition was
        taken since, perhaps by an in-place gain at an older term's number: the highest of
        them alone would not show that)."""
        async with self.db.timed("epoch") as conn:
            return int(
                await conn.fetchval(
                    "SELECT CASE WHEN min(epoch) = max(epoch) THEN max(epoch) ELSE -1 END "
                    "FROM partition_offices WHERE partition = ANY($1::smallint[])",
                    list(self.office),
                )
            )

    async def mark_fired(self, epoch: int, fired: Sequence[Fired], instance: str) -> None:
        """Record deliveries, one statement per `FIRED_CHUNK` of them: each task's row
        deleted, a tombstone in `fired_tasks` (its id stays refused for the retention,
        migration 0010) and one `fire_log` row.

        Idempotent: tombstone and log row are written only for a task this statement deletes
        while claimed by `epoch`, which happens once per task (one row per task and attempt),
        and the unique index `fire_log_once` drops an exact repeat of a row (migration 0006);
        so a flush that fails after some chunks committed is simply recorded again."""
        for start in range(0, len(fired), FIRED_CHUNK):
            await self._mark_fired(epoch, fired[start : start + FIRED_CHUNK], instance)

    async def _mark_fired(self, epoch: int, fired: Sequence[Fired], instance: str) -> None:
        if not fired:
            return
        columns = (
            [f.task.id for f in fired],
            [f.task.target for f in fired],
            [f.stream for f in fired],
        )
        packed = [joined(c) for c in columns]
        texts: tuple[str | list[str], ...]
        if None in packed:  # a separator or an empty value inside: plain arrays
            texts, (a, b, c) = columns, ("$3::text[]", "$4::text[]", "$8::text[]")
        else:
            texts = tuple(t for t in packed if t is not None)
            a, b, c = (f"string_to_array(${n}, {SEP_SQL})" for n in (3, 4, 8))
        async with self.db.timed("fired") as conn:
            await fenced(
                conn,
                epoch,
                f"u AS MATERIALIZED (SELECT u.id, u.subject, {EPOCH_US} + u.sched_us * "
                f"{ONE_US} AS sched, {EPOCH_US} + u.fired_us * {ONE_US} AS fired_at, "
                f"u.attempt, u.stream, u.seq, $1::bigint AS epoch FROM unnest({a}, {b}, "
                f"$5::bigint[], $6::bigint[], $7::int[], {c}, $9::bigint[]) "
                "AS u(id, subject, sched_us, fired_us, attempt, stream, seq)), "
                "upd AS (DELETE FROM delayed_messages d USING u, lead WHERE "
                f"{BY_IDS_OF_U.format(row='d')} AND d.partition = lead.partition AND "
                f"{states.claimed_by('u.epoch', 'd')} "
                "RETURNING d.id, d.target, "
                "md5(d.payload)::uuid AS digest, u.subject, u.sched, u.fired_at, u.attempt, "
                "u.stream, u.seq), "
                "tomb AS (INSERT INTO fired_tasks (id, target, digest, fired_at) SELECT id, "
                "target, digest, fired_at FROM upd ON CONFLICT (id) DO NOTHING), "
                "ins AS (INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, "
                "attempt, epoch, instance, stream, stream_seq) SELECT 'delayed', id, "
                "subject, sched, fired_at, attempt, $1, $2, stream, seq "
                "FROM upd ON CONFLICT DO NOTHING RETURNING 1)",
                instance,
                texts[0],
                texts[1],
                [micros(f.task.scheduled_for) for f in fired],
                [micros(f.fired_at) for f in fired],
                [f.task.attempts for f in fired],
                texts[2],
                [f.stream_seq for f in fired],
                **fenced_by(self._partitions_of(f.task.id for f in fired), self.office),
                custom_plan=True,
            )

    async def retry_later(
        self, epoch: int, items: Sequence[tuple[ClaimedTask, datetime, str, bool]]
    ) -> None:
        """Put failed publishes back with a later due time and the error text: `pending` when
        the message was certainly not stored, `in_doubt` (the last item) when it went out
        unacknowledged, and for good once a task has been in doubt (`doubted`)."""
        if not items:
            return
        async with self.db.timed("retry") as conn:
            await fenced(
                conn,
                epoch,
                "u AS MATERIALIZED (SELECT u.*, $1::bigint AS epoch FROM unnest($2::text[], "
                "$3::timestamptz[], $4::text[], $5::boolean[]) AS u(id, due, err, doubt)), "
                "upd AS (UPDATE delayed_messages d SET status = "
                f"{states.ready_again('d.doubted OR u.doubt')}, doubted = d.doubted OR u.doubt, "
                f"due_at = u.due, {states.UNCLAIM}, last_error = u.err, updated_at = now() "
                f"FROM u, lead WHERE {BY_IDS_OF_U.format(row='d')} AND "
                "d.partition = lead.partition AND "
                f"{states.claimed_by('u.epoch', 'd')} RETURNING 1)",
                [t.id for t, _, _, _ in items],
                [d for _, d, _, _ in items],
                [e for _, _, e, _ in items],
                [doubt for _, _, _, doubt in items],
                **fenced_by(self._partitions_of(t.id for t, _, _, _ in items), self.office),
                custom_plan=True,
            )

    async def expire(self, epoch: int, ids: Sequence[str]) -> None:
        """Mark claimed tasks expired: past `timestamp + ttl_seconds`, never delivered."""
        if not ids:
            return
        async with self.db.timed("expire") as conn:
            await fenced(
                conn,
                epoch,
                "upd AS (UPDATE delayed_messages SET status = 'expired', updated_at = now() "
                "FROM lead WHERE id = ANY($2::text[]) AND delayed_messages.partition = "
                f"lead.partition AND {states.claimed_by('$1')} RETURNING 1)",
                list(ids),
                **fenced_by(self._partitions_of(ids), self.office),
            )

    async def kill(self, epoch: int, items: Sequence[tuple[ClaimedTask, str, str]]) -> None:
        """Dead-letter claimed tasks: status dead plus a `dead_letters` row with the error."""
        if not items:
            return
        async with self.db.timed("dead") as conn:
            await fenced(
                conn,
                epoch,
                "u AS MATERIALIZED (SELECT u.*, $1::bigint AS epoch FROM unnest($2::text[], "
                "$3::text[], $4::text[]) AS u(id, err, reason)), d AS (UPDATE delayed_messages m "
                "SET status = 'dead', last_error = u.err, updated_at = now() FROM u, lead "
                f"WHERE {BY_IDS_OF_U.format(row='m')} AND m.partition = lead.partition AND "
                f"{states.claimed_by('u.epoch', 'm')} "
                "RETURNING m.*, u.err, u.reason), "
                # the task's bytes once, whole (a task fits max_payload), in `raw`
                "ins AS (INSERT INTO dead_letters (original_id, subject, payload, error, "
                "attempts, first_seen, reason, stage, target, raw, headers, raw_size) SELECT id, "
                "target, 'null', err, attempts, created_at, reason, 'firing', target, payload, "
                "headers, octet_length(payload) FROM d RETURNING 1)",
                [t.id for t, _, _ in items],
                [printable(e) for _, e, _ in items],
                [r for _, _, r in items],
                **fenced_by(self._partitions_of(t.id for t, _, _ in items), self.office),
                custom_plan=True,
            )

    async def pending_count(self) -> int:
        """Pending and in-doubt tasks not claimed: all of them (an index-only scan of
        `delayed_messages_org_open`) less the claimed ones, found among those due within
        CLAIM_WINDOW, partition by partition (a filter on `claimed_epoch` over the whole table
        read every row)."""
        claimed = " - ".join(
            f"(SELECT count(*) FROM {EACH_OF.format('$1')} CROSS JOIN LATERAL (SELECT 1 FROM "
            f"delayed_messages WHERE {states.claimed_as(s)} AND partition = o.part "
            f"AND due_at <= now() + {CLAIM_WINDOW}) AS c)"
            for s in states.READY_STATUSES
        )
        async with self.db.timed("count") as conn:
            return int(
                await conn.fetchval(
                    f"SELECT (SELECT count(*) FROM delayed_messages WHERE {states.ready()}) - "
                    f"{claimed}",
                    list(range(self.partitions)),
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
