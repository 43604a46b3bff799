"""A fired task's row is deleted; a narrow tombstone keeps its id refused for the retention.

`fired_tasks` holds one row per fired delayed task: its id (the primary key intake probes),
target, an MD5 digest of its bytes (so a resend of the same task is still told apart from
another task reusing the id, as when the full row was kept) and when it fired (the upkeep
deletes tombstones older than `SCHEDULER_FIRE_LOG_RETENTION` through the BRIN index
`fired_tasks_fired_at`).
`TaskStore.mark_fired` deletes the task's row and writes its tombstone and `fire_log` row in
one statement, so `delayed_messages` holds only tasks not yet fired (and, until the purge,
cancelled, expired and dead ones). See
docs/decisions/2026-11-25-fired-tasks-leave-a-tombstone.md for the alternatives measured.

The per-organisation index of migration 0009 no longer covers claimed tasks: a claim then
writes one index entry less (2.5 us of PostgreSQL CPU per task, bench/pg_task_cost.py), and the
few claimed tasks are counted through the claimed index. Rebuilding it scans the table once,
holding writes meanwhile (as 0009 did): on a table of millions of rows, upgrade in a quiet
moment.

Upgrade: fired rows already in `delayed_messages` become tombstones and are deleted (their
`fire_log` rows exist). Downgrade: the tombstones are dropped; the fired tasks' rows cannot be
restored (their bytes are gone), so the older code would accept a re-published id that fired
before the downgrade.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


ORG_INDEX = "delayed_messages_org_open"


def _org_index(statuses: str) -> None:
    op.execute(f"DROP INDEX IF EXISTS {ORG_INDEX}")
    op.execute(
        f"CREATE INDEX {ORG_INDEX} ON delayed_messages (org_id) WHERE status IN ({statuses})"
    )


def upgrade() -> None:
    op.execute(
        "CREATE TABLE fired_tasks (id TEXT PRIMARY KEY, target TEXT NOT NULL, "
        "digest UUID NOT NULL, fired_at TIMESTAMPTZ NOT NULL)"
    )
    # BRIN, not a B-tree: tombstones are written in fired_at order and purged oldest first, so
    # block ranges summarise them well, and an insert costs next to nothing (bench/pg_task_cost.py)
    op.execute(
        "CREATE INDEX fired_tasks_fired_at ON fired_tasks USING brin (fired_at) "
        "WITH (autosummarize = on)"
    )
    op.execute(
        "WITH gone AS (DELETE FROM delayed_messages WHERE status = 'fired' "
        "RETURNING id, target, payload, coalesce(fired_at, updated_at) AS fired_at) "
        "INSERT INTO fired_tasks (id, target, digest, fired_at) "
        "SELECT id, target, md5(payload)::uuid, fired_at FROM gone"
    )
    # Claimed tasks leave the per-organisation index: the claim (status pending -> claimed)
    # then adds no entry to it; `pending_by_org` counts them through the claimed index.
    _org_index("'pending', 'in_doubt'")


def downgrade() -> None:
    _org_index("'pending', 'in_doubt', 'claimed'")
    op.execute("DROP TABLE fired_tasks")
