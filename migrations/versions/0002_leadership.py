"""Leadership: the fencing epoch, and the original due time of delayed tasks.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE leadership (
            id       SMALLINT PRIMARY KEY DEFAULT 1 CHECK (id = 1),
            epoch    BIGINT NOT NULL DEFAULT 0,
            instance TEXT,
            since    TIMESTAMPTZ
        )
        """
    )
    op.execute("INSERT INTO leadership (id, epoch) VALUES (1, 0)")
    # `due_at` moves on retries; `scheduled_for` keeps the time the producer asked for.
    op.execute("ALTER TABLE delayed_messages ADD COLUMN scheduled_for TIMESTAMPTZ")
    op.execute("UPDATE delayed_messages SET scheduled_for = due_at")
    op.execute("ALTER TABLE delayed_messages ALTER COLUMN scheduled_for SET NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE delayed_messages DROP COLUMN scheduled_for")
    op.execute("DROP TABLE leadership")
