"""A cron job stopped by a permanent publish error: when, why, and the error naming the field.

A job whose message can never be published (its envelope is larger than the server's
`max_payload`, or any other error the publisher marks permanent) is not retried: the leader
records the failure on the job's `schedules` row (`failed_at`, `failed_reason`, `failed_error`)
in a statement fenced by its epoch and tied to the job's fingerprint, and stops firing it. A
sync that changes the job's definition (or re-adds a removed job) clears the three columns, as
does an operator's resume. See docs/cron.md, "A job that can never be published".

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE schedules ADD COLUMN failed_at TIMESTAMPTZ, "
        "ADD COLUMN failed_reason TEXT, ADD COLUMN failed_error TEXT"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE schedules DROP COLUMN failed_at, DROP COLUMN failed_reason, "
        "DROP COLUMN failed_error"
    )
