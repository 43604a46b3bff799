"""Cron jobs synced from YAML, and their cursors.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE schedules (
            name        TEXT PRIMARY KEY,
            definition  JSONB NOT NULL,
            fingerprint TEXT NOT NULL,
            file        TEXT,
            line        INTEGER,
            active      BOOLEAN NOT NULL DEFAULT true,
            created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE schedule_state (
            name               TEXT PRIMARY KEY REFERENCES schedules (name) ON DELETE CASCADE,
            last_scheduled_for TIMESTAMPTZ NOT NULL,
            last_fired_at      TIMESTAMPTZ,
            last_stream_seq    BIGINT,
            skipped            BIGINT NOT NULL DEFAULT 0,
            epoch              BIGINT NOT NULL,
            updated_at         TIMESTAMPTZ NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE schedule_state")
    op.execute("DROP TABLE schedules")
