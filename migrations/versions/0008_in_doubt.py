"""Delayed tasks in doubt: published, but the acknowledgement never came.

A task whose publish timed out may be in its target stream or not. It is no longer `pending`
(a cancel must not answer `cancelled` for a task JetStream may hold) but `in_doubt`, due again
after a backoff, when the leader republishes it with the same `Nats-Msg-Id` (the target
stream's duplicate window drops it if it was stored). `doubted` remembers that a task has been
in doubt once: a later failure that is certain (no stream, say) does not make it `pending`
again, since the first attempt may still have been stored. The new status gets its own small
partial index beside the pending one (empty when created, so the migration takes no time on a
big table); the loader reads both in firing order.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

STATUSES = "'pending', 'claimed', 'fired', 'cancelled', 'expired', 'dead'"


def upgrade() -> None:
    op.execute("ALTER TABLE delayed_messages DROP CONSTRAINT delayed_messages_status_check")
    # NOT VALID then VALIDATE: the scan of existing rows does not block writes meanwhile
    op.execute(
        "ALTER TABLE delayed_messages ADD CONSTRAINT delayed_messages_status_check "
        f"CHECK (status IN ({STATUSES}, 'in_doubt')) NOT VALID"
    )
    op.execute("ALTER TABLE delayed_messages VALIDATE CONSTRAINT delayed_messages_status_check")
    op.execute(
        "CREATE INDEX delayed_messages_in_doubt_due ON delayed_messages (due_at, priority, seq) "
        "WHERE status = 'in_doubt'"
    )
    op.execute("ALTER TABLE delayed_messages ADD COLUMN doubted BOOLEAN NOT NULL DEFAULT false")


def downgrade() -> None:
    op.execute("ALTER TABLE delayed_messages DROP COLUMN IF EXISTS doubted")
    op.execute("DROP INDEX IF EXISTS delayed_messages_in_doubt_due")
    # a task still in doubt goes back to pending: the older code republishes it the same way
    op.execute("UPDATE delayed_messages SET status = 'pending' WHERE status = 'in_doubt'")
    op.execute("ALTER TABLE delayed_messages DROP CONSTRAINT delayed_messages_status_check")
    op.execute(
        "ALTER TABLE delayed_messages ADD CONSTRAINT delayed_messages_status_check "
        f"CHECK (status IN ({STATUSES}))"
    )
