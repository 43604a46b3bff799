"""The partition count is chosen by the first engine that starts, not fixed at 1.

Migration 0022 recorded a partition count of 1, and an engine configured with another
(`SCHEDULER_PARTITIONS`) refused to start, since rows stored under one count sit in the wrong
partitions under another. That made any other count impossible to choose without editing the
table by hand. `partitioning.chosen_at` says whether the count has been chosen: the first
engine to start (`scheduler.store.postgres.partitioning.check_partitions`) records its own
count, if no task and no cron job is stored yet, or confirms the recorded one; from then on a
different count is refused as before. Two engines configured differently and starting at once
on an empty database cannot both choose: the first update takes the row, the second finds it
chosen.

Expand only: a nullable column (NULL: not chosen yet, every existing deployment, whose first
engine after the upgrade confirms its count of 1). Downgrade drops it.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE partitioning ADD COLUMN chosen_at TIMESTAMPTZ")


def downgrade() -> None:
    op.execute("ALTER TABLE partitioning DROP COLUMN chosen_at")
