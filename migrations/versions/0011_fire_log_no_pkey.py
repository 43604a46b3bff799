"""`fire_log` loses its primary key (id, fired_at): no statement reads a row by its id.

Every `fire_log` query filters on `fired_at` (the index `fire_log_fired_at`: lateness, the
export, the JDBC slices of the audit) or on the key (the unique index `fire_log_once`, which also
drops an exact repeat of a row, migration 0006); `id` comes from a sequence and is never looked
up. The primary key index was a third B-tree entry per delivery (see
docs/decisions/2026-11-25-fire-log-without-a-primary-key.md for the measured cost). The column and its sequence stay.

Dropping an index takes a short exclusive lock and no scan. Downgrade adds the key again,
which scans `fire_log` once to build it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE fire_log DROP CONSTRAINT IF EXISTS fire_log_pkey")


def downgrade() -> None:
    op.execute("ALTER TABLE fire_log ADD CONSTRAINT fire_log_pkey PRIMARY KEY (id, fired_at)")
