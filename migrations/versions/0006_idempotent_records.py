"""Records written once: one fire-log row per delivery, one dead letter per bad intake message.

Fire log.

PostgreSQL allows a unique index on a partitioned table only when it contains the partition
key (`fired_at` here), so "one row per task and attempt" cannot be a constraint on
(kind, key, attempt) alone. It is kept by two things instead:
- the statement that books a delivery writes its row only for a task it moves from claimed to
  fired (`TaskStore.mark_fired`), which happens once per claim, under the task's row lock;
- this index, (key, scheduled_for, kind, attempt, fired_at), which drops an exact repeat of a
  row: a retried booking of a delayed task or a cron occurrence carries the same values, the
  same `fired_at` included, and `ON CONFLICT DO NOTHING` skips it. It replaces the index
  `fire_log_key` (key, scheduled_for), which is its prefix, so it costs no extra index.
Rows the old retry loop doubled are removed first (the index could not be built otherwise).

Dead letters. A bad intake message is recorded, then termed; if the leader dies in between, the
message comes back to its successor. `intake_key` (the lane's stream, sequence and store time)
is unique, so the second recording is skipped: every bad message is dead-lettered once.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "DELETE FROM fire_log a USING fire_log b WHERE a.key = b.key AND a.kind = b.kind "
        "AND a.scheduled_for = b.scheduled_for AND a.attempt = b.attempt "
        "AND a.fired_at = b.fired_at AND a.id > b.id"
    )
    op.execute("DROP INDEX IF EXISTS fire_log_key")
    op.execute(
        "CREATE UNIQUE INDEX fire_log_once ON fire_log (key, scheduled_for, kind, attempt, fired_at)"
    )
    op.execute("ALTER TABLE dead_letters ADD COLUMN intake_key TEXT")
    op.execute("CREATE UNIQUE INDEX dead_letters_intake_key ON dead_letters (intake_key)")


def downgrade() -> None:
    op.execute("ALTER TABLE dead_letters DROP COLUMN intake_key")
    op.execute("DROP INDEX fire_log_once")
    op.execute("CREATE INDEX fire_log_key ON fire_log (key, scheduled_for)")
