"""The organisation of each delayed task, for per-org quotas and fair firing.

`org_id` is the envelope's (nullable: tasks without one, and every task stored before this
migration, belong to no organisation). Adding a nullable column without a default is a
catalogue change only, instant on a big table. The partial index on the unfinished tasks lets
the leader count them per organisation (`GROUP BY org_id`) when it takes office and every
`COUNT_EVERY` seconds after (its build scans the table once, holding writes meanwhile: on a
table of millions of rows, run the upgrade in a quiet moment).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

INDEX = "delayed_messages_org_open"


def upgrade() -> None:
    op.execute("ALTER TABLE delayed_messages ADD COLUMN org_id text")
    op.execute(
        f"CREATE INDEX {INDEX} ON delayed_messages (org_id) "
        "WHERE status IN ('pending', 'in_doubt', 'claimed')"
    )


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {INDEX}")
    op.execute("ALTER TABLE delayed_messages DROP COLUMN org_id")
