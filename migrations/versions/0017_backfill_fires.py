"""`backfill_fires`: each cron occurrence an operator's backfill fired, once per job and
occurrence, for good.

A backfill (`POST /v1/schedules/{name}/backfill`) publishes each occurrence of a past window
with its own `Nats-Msg-Id` (`<job>@backfill-<occurrence>`), but a target stream's duplicate
window lasts minutes: whether an occurrence was already backfilled is decided here. A row is
claimed (`claimed_at`, by `instance`) before its publish and confirmed (`fired_at`, stream and
sequence) after the PubAck, in the same statement as its `fire_log` row (marked manual). A
claim left unconfirmed (the instance died, the publish got no answer) may be taken again by a
later backfill after a minute; its publish reuses the message id.

Expand only: a new table the previous version never reads. Downgrade drops it (a backfill
after a downgrade may fire an occurrence again).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE backfill_fires (
            name          TEXT NOT NULL,
            scheduled_for TIMESTAMPTZ NOT NULL,
            msg_id        TEXT NOT NULL,
            instance      TEXT NOT NULL,
            claimed_at    TIMESTAMPTZ NOT NULL,
            fired_at      TIMESTAMPTZ,
            stream        TEXT,
            stream_seq    BIGINT,
            PRIMARY KEY (name, scheduled_for)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE backfill_fires")
