"""Fire-log upkeep as the schema owner, so the daemon may run under a role that only reads and
writes rows (docs/deploy.md, PostgreSQL roles).

Creating and attaching a partition needs the owner of `fire_log` (and CREATE on the schema, which
PostgreSQL 15 no longer grants to everyone on `public`); a least-privilege daemon role failed
there every hour and the default partition grew for ever. The upkeep function now runs with its
owner's rights (SECURITY DEFINER, search_path pinned to the schema) and only roles granted
EXECUTE may call it; the owner always may.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UPKEEP = "scheduler_fire_log_upkeep(INTEGER, INTEGER)"


def upgrade() -> None:
    op.execute(
        f"""
        DO $$ BEGIN
            EXECUTE format(
                'ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp',
                '{UPKEEP}', current_schema()
            );
        END $$
        """
    )
    op.execute(f"REVOKE EXECUTE ON FUNCTION {UPKEEP} FROM PUBLIC")


def downgrade() -> None:
    op.execute(f"GRANT EXECUTE ON FUNCTION {UPKEEP} TO PUBLIC")
    op.execute(f"ALTER FUNCTION {UPKEEP} SECURITY INVOKER RESET search_path")
