"""Operations: operator pauses of cron jobs, manual fires in the log, a safe payload reader.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Reads one top-level field of a stored envelope as text; NULL for anything that is not a JSON
# object (or not UTF-8), so a filter over many rows never fails on one odd payload.
PAYLOAD_FIELD = """
CREATE FUNCTION scheduler_payload_field(payload BYTEA, field TEXT) RETURNS TEXT
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(payload, 'UTF8')::json ->> field;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;
"""


def upgrade() -> None:
    # An operator's pause (API or CLI) is kept apart from the YAML's `paused`, so a reload of
    # the files never undoes it and resuming never overrides a pause written in YAML.
    op.execute("ALTER TABLE schedules ADD COLUMN paused_at TIMESTAMPTZ, ADD COLUMN paused_by TEXT")
    op.execute("ALTER TABLE fire_log ADD COLUMN manual BOOLEAN NOT NULL DEFAULT false")
    op.execute(PAYLOAD_FIELD)


def downgrade() -> None:
    op.execute("DROP FUNCTION scheduler_payload_field(BYTEA, TEXT)")
    op.execute("ALTER TABLE fire_log DROP COLUMN manual")
    op.execute("ALTER TABLE schedules DROP COLUMN paused_at, DROP COLUMN paused_by")
