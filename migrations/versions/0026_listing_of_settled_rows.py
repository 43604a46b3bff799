"""An index of the rows of no ready status in firing order, for the listing of every task.

`GET /v1/delayed` without a status (the console's delayed page and `scheduler delayed list`
by default) read every row of `delayed_messages` and sorted them to return the first page:
64 ms of PostgreSQL for one row at 200,000 pending tasks, every time the page was asked for
(the console refreshes it every few seconds). The ready statuses each have an index in firing
order per partition (0024); this one covers the rest (finished rows kept until the upkeep's
purge, cancel and reschedule intents, rows a daemon older than 0013 claimed), so the listing
merges three ordered index reads and stops at its page.

Nothing on the firing path writes it: intake stores `pending` rows, a claim changes no indexed
column, firing deletes the row. A cancel, a dead letter or an intent adds an entry, as each
already does to the table's other indexes.

Expand only: a new index. Downgrade drops it.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

INDEX = "delayed_messages_not_ready_due"


def upgrade() -> None:
    op.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON delayed_messages (due_at, priority, seq) "
        "WHERE status NOT IN ('pending', 'in_doubt')"
    )


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {INDEX}")
