"""Bounded inputs (issue 35, items 5 and 8): intents counted per organisation, and lane notes.

1. A partial index on the intents' `org_id` (the organisation their target names,
   `mq.org.<org>.>`), so a cancel counts its organisation's live intents over the index
   (SCHEDULER_INTENT_MAX_PER_ORG), as it counts its target's (`delayed_messages_intents`).
   Intents of a previous version carry no `org_id`: they count towards their target and the
   total only, and lapse within SCHEDULER_INTENT_TTL.
2. `lane_notes`: the target of each task the management API or the NATS `schedule` verb put
   on the delay lane, written before the publish, so a cancel (reschedule) that names no
   target, sent to any instance right after the answer, finds the task's target while the
   task is still on the lane and records its intent (scheduler/store/postgres/lane_notes.py).
   Deleted past `expires_at` (SCHEDULER_INTENT_TTL) by the hourly upkeep.

Expand only: an index on a few small rows and a table the previous version never reads.
Downgrade drops both.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX delayed_messages_intents_org ON delayed_messages (org_id, expires_at) "
        "WHERE status = 'intent'"
    )
    op.execute(
        """
        CREATE TABLE lane_notes (
            id          TEXT PRIMARY KEY,
            target      TEXT NOT NULL,
            expires_at  TIMESTAMPTZ NOT NULL
        )
        """
    )
    op.execute("CREATE INDEX lane_notes_expires ON lane_notes (expires_at)")


def downgrade() -> None:
    op.execute("DROP TABLE lane_notes")
    op.execute("DROP INDEX delayed_messages_intents_org")
