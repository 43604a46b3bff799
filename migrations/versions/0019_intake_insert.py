"""`scheduler_intake_insert`: intake's insert and its tombstone check in one call, so a batch
costs one round trip instead of four (BEGIN, the insert, the check, COMMIT).

The function runs the two statements intake used to send one by one, unchanged:
1. the batch's `INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE d.status = 'intent'` (a task
   takes over its id's intent row, honouring a live intent of its target: a cancel stores it
   `cancelled`, a reschedule at the new time; any other row is left alone);
2. a `DELETE` of the rows just inserted whose id has a tombstone in `fired_tasks` (the task
   fired), in the same transaction, and those rows left out of the result.
The second must see a tombstone committed while the insert waited on the unique index for a
concurrent `mark_fired` deleting the same id. It does: the function is VOLATILE, and in READ
COMMITTED a volatile function takes a new snapshot for each statement it runs (a STABLE one
would keep the caller's snapshot, and may not write anyway). Not PARALLEL SAFE: it writes.

It returns the rows the insert stored, minus those deleted: `id, due_at, priority, seq,
org_id, status` (`cancelled` for a task that met a cancel intent). An error of either
statement (a check, a value too large for an index) reaches the caller with its own SQLSTATE,
so intake's halving on row errors finds the row as before. The arrays are the caller's
(`unnest` pads a NULL array, `new_exp_us` or `new_org_ids`, with NULLs); the SQL is what
scheduler/store/postgres/task_intake.py sent before this revision (its intent predicate is
`LIVE` of scheduler/store/postgres/intents.py): a change to it is a new migration.

Expand only: a new function the previous version never calls; it runs with the caller's
rights, and the daemon's role gets EXECUTE like every function (docs/security.md). Downgrade
drops it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

SIGNATURE = (
    "scheduler_intake_insert(TEXT[], TEXT[], BYTEA[], JSONB[], SMALLINT[], BIGINT[], BIGINT[], "
    "BIGINT[], TEXT[])"
)

# A live intent on the row `d` for the task `excluded`.
LIVE = "(d.status = 'intent' AND d.target = excluded.target AND d.expires_at > now())"
EPOCH = "'1970-01-01T00:00:00Z'::timestamptz"
ONE_US = "interval '1 microsecond'"

FUNCTION = f"""
CREATE FUNCTION scheduler_intake_insert(
    new_ids TEXT[], new_targets TEXT[], new_payloads BYTEA[], new_headers JSONB[],
    new_priorities SMALLINT[], new_due_us BIGINT[], new_sched_us BIGINT[], new_exp_us BIGINT[],
    new_org_ids TEXT[]
) RETURNS TABLE (
    id TEXT, due_at TIMESTAMPTZ, priority SMALLINT, seq BIGINT, org_id TEXT, status TEXT
) LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
#variable_conflict use_column
DECLARE
    got_ids TEXT[];
    got_due TIMESTAMPTZ[];
    got_priorities SMALLINT[];
    got_seqs BIGINT[];
    got_orgs TEXT[];
    got_statuses TEXT[];
    gone TEXT[];
BEGIN
    WITH ins AS (
        INSERT INTO delayed_messages AS d (id, target, payload, headers, priority, due_at,
            scheduled_for, expires_at, org_id)
        SELECT u.id, u.target, u.payload, u.headers, u.priority,
            {EPOCH} + u.due_us * {ONE_US}, {EPOCH} + u.sched_us * {ONE_US},
            {EPOCH} + u.exp_us * {ONE_US}, u.org_id
        FROM unnest(new_ids, new_targets, new_payloads, new_headers, new_priorities,
            new_due_us, new_sched_us, new_exp_us, new_org_ids)
            AS u(id, target, payload, headers, priority, due_us, sched_us, exp_us, org_id)
        ON CONFLICT (id) DO UPDATE SET target = excluded.target, payload = excluded.payload,
            headers = excluded.headers, priority = excluded.priority,
            org_id = excluded.org_id, expires_at = excluded.expires_at, seq = excluded.seq,
            created_at = now(), updated_at = now(),
            status = CASE WHEN {LIVE} AND d.intent = 'cancel' THEN 'cancelled'
                ELSE 'pending' END,
            due_at = CASE WHEN {LIVE} AND d.intent = 'reschedule' THEN d.due_at
                ELSE excluded.due_at END,
            scheduled_for = CASE WHEN {LIVE} AND d.intent = 'reschedule' THEN d.scheduled_for
                ELSE excluded.scheduled_for END,
            intent = CASE WHEN {LIVE} THEN d.intent END
        WHERE d.status = 'intent'
        RETURNING d.id, d.due_at, d.priority, d.seq, d.org_id, d.status
    )
    SELECT array_agg(ins.id), array_agg(ins.due_at), array_agg(ins.priority),
        array_agg(ins.seq), array_agg(ins.org_id), array_agg(ins.status)
    INTO got_ids, got_due, got_priorities, got_seqs, got_orgs, got_statuses
    FROM ins;
    IF got_ids IS NULL THEN
        RETURN;
    END IF;
    -- A statement of its own, so a new snapshot: it sees a tombstone committed while the
    -- insert waited (see the migration's docstring).
    WITH t AS (SELECT f.id FROM fired_tasks f WHERE f.id = ANY(got_ids)),
    del AS (DELETE FROM delayed_messages d USING t WHERE d.id = t.id RETURNING d.id)
    SELECT array_agg(del.id) INTO gone FROM del;
    RETURN QUERY SELECT r.id, r.due_at, r.priority, r.seq, r.org_id, r.status
        FROM unnest(got_ids, got_due, got_priorities, got_seqs, got_orgs, got_statuses)
            AS r(id, due_at, priority, seq, org_id, status)
        WHERE gone IS NULL OR r.id <> ALL(gone);
END $$
"""


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
