"""`activity_log`: every operator action taken through the management API (and so the console
and the CLI), and the note an operator leaves with a pause (`schedules.pause_note`).

One row per write request that reached its operation: who (`who`: the token kind and address;
`via` `console` with the console session's tag, or `api`), when (`at`), the action (`pause`,
`trigger`, `replay`, ...), its `target` (job name, task id, dead-letter id, `*` for a filter),
a bounded `detail` (JSON: the note, the new due time, counts), the answer (`http_status`, and
`outcome`: the operation's status or the problem's code), the request id and the
Idempotency-Key. Rows older than SCHEDULER_ACTIVITY_RETENTION are deleted by the hourly upkeep
(index on `at`). Lists read newest first by (`at`, `id`).

Expand only: a new table the previous version never reads and a nullable column it never
writes (a previous version's pause leaves the note as it was; its resume does not clear it,
and the next pause overwrites it). Downgrade drops both.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE activity_log (
            id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            at              TIMESTAMPTZ NOT NULL,
            who             TEXT NOT NULL,
            via             TEXT NOT NULL CHECK (via IN ('api', 'console')),
            session         TEXT,
            action          TEXT NOT NULL,
            route           TEXT NOT NULL,
            target          TEXT NOT NULL,
            detail          JSONB NOT NULL DEFAULT '{}',
            http_status     INTEGER NOT NULL,
            outcome         TEXT NOT NULL,
            request_id      TEXT NOT NULL,
            idempotency_key TEXT
        )
        """
    )
    op.execute("CREATE INDEX activity_log_at ON activity_log (at, id)")
    op.execute("CREATE INDEX activity_log_action ON activity_log (action, at, id)")
    op.execute("CREATE INDEX activity_log_target ON activity_log (target, at, id)")
    op.execute("ALTER TABLE schedules ADD COLUMN pause_note TEXT")


def downgrade() -> None:
    op.execute("ALTER TABLE schedules DROP COLUMN IF EXISTS pause_note")
    op.execute("DROP TABLE IF EXISTS activity_log")
