"""Cancel and reschedule intents: a producer's cancel that arrives before its task.

A producer that holds its PubAck may cancel (or reschedule) its task while the task is still on
the delay lane, not yet taken by intake. The cancel then stores an *intent*: a row of
`delayed_messages` with status `intent`, the task's id and target, `intent` saying what to do
(`cancel`, or `reschedule` to `due_at`) and `expires_at` when it lapses. Keeping it in the same
table puts the race between intake inserting the task and the cancel recording its intent on
one atomic point, the primary key `id`: whichever inserts first, the other meets its row in
`INSERT ... ON CONFLICT (id)` (waiting for it to commit) and acts on it (see
scheduler/store/postgres/intents.py).

Expand only (docs/deploy.md): a new status value (the check constraint is replaced NOT VALID,
then validated without blocking writes), a nullable column, and a small partial index on the
intents alone (empty when created). A previous version still running meets an intent row only
if it takes the task off the lane itself: its `ON CONFLICT (id) DO NOTHING` leaves the intent
alone and refuses the task as `duplicate_id` (dead-lettered, never delivered), which keeps the
`cancelled` answer true; its purge never deletes an intent.

Downgrade: intents are deleted (a cancel answered `cancelled` for a task still on the lane
then no longer holds: downgrade with the lane drained), the column, index and status go.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

STATUSES = "'pending', 'claimed', 'fired', 'cancelled', 'expired', 'dead', 'in_doubt'"


def _status_check(statuses: str) -> None:
    op.execute("ALTER TABLE delayed_messages DROP CONSTRAINT delayed_messages_status_check")
    op.execute(
        "ALTER TABLE delayed_messages ADD CONSTRAINT delayed_messages_status_check "
        f"CHECK (status IN ({statuses})) NOT VALID"
    )
    op.execute("ALTER TABLE delayed_messages VALIDATE CONSTRAINT delayed_messages_status_check")


def upgrade() -> None:
    _status_check(f"{STATUSES}, 'intent'")
    op.execute(
        "ALTER TABLE delayed_messages ADD COLUMN intent TEXT "
        "CHECK (intent IN ('cancel', 'reschedule'))"
    )
    op.execute(
        "CREATE INDEX delayed_messages_intents ON delayed_messages (target, expires_at) "
        "WHERE status = 'intent'"
    )


def downgrade() -> None:
    op.execute("DELETE FROM delayed_messages WHERE status = 'intent'")
    op.execute("DROP INDEX IF EXISTS delayed_messages_intents")
    op.execute("ALTER TABLE delayed_messages DROP COLUMN IF EXISTS intent")
    _status_check(STATUSES)
