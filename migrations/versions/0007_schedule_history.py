"""Schedule history: each cron job definition and the interval it was in force (YAML syncs and
operator pauses).

The YAML sync closes a job's open row and opens a new one whenever the job is added, changed
(paused included) or removed, so the drift audit knows which occurrences were expected at any
moment of a day. Jobs already in `schedules` are backfilled as in force since their last change.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE schedule_history (
            id          BIGSERIAL PRIMARY KEY,
            name        TEXT NOT NULL,
            definition  JSONB NOT NULL,
            fingerprint TEXT,
            valid_from  TIMESTAMPTZ NOT NULL,
            valid_to    TIMESTAMPTZ,
            CHECK (valid_to IS NULL OR valid_to >= valid_from)
        )
        """
    )
    op.execute(
        "CREATE UNIQUE INDEX schedule_history_open ON schedule_history (name) WHERE valid_to IS NULL"
    )
    op.execute("CREATE INDEX schedule_history_span ON schedule_history (valid_from, valid_to)")
    op.execute(
        "INSERT INTO schedule_history (name, definition, fingerprint, valid_from) "
        "SELECT name, CASE WHEN paused_at IS NULL THEN definition "
        "ELSE definition || '{\"paused\": true}'::jsonb END, fingerprint, updated_at "
        "FROM schedules WHERE active"
    )


def downgrade() -> None:
    op.execute("DROP TABLE schedule_history")
