"""Claims by partition (issue 37, docs/decisions/2026-12-06-partition-ownership.md, step 2): the
ready tasks' indexes lead with the partition.

`delayed_messages_pending_due` and `delayed_messages_in_doubt_due` were `(due_at, priority,
seq)` over the rows of their status; they become `(partition, due_at, priority, seq)`, under
the same names (dashboards and tests name them). Every read of them (the loader, the sweep,
the orphan sweep, the pending count, the forecast, the task listing of a ready status) reads
one range per partition and merges them (`scheduler/store/postgres/tasks.py`, `_OWNED`): one
index instead of two, so intake pays for no more index entries than before.

While a Deployment rolls, the previous version's loader (no partition in its query) finds no
index in due order; under P = 1 every row is in partition 0, so the planner can still read the
index whole in order, but may sort instead: slower pages until the roll ends, never wrong.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

INDEXES = {"delayed_messages_pending_due": "pending", "delayed_messages_in_doubt_due": "in_doubt"}


def _rebuild(columns: str) -> None:
    for name, status in INDEXES.items():
        op.execute(
            f"CREATE INDEX {name}_new ON delayed_messages ({columns}) WHERE status = '{status}'"
        )
        op.execute(f"DROP INDEX {name}")
        op.execute(f"ALTER INDEX {name}_new RENAME TO {name}")


def upgrade() -> None:
    _rebuild("partition, due_at, priority, seq")


def downgrade() -> None:
    _rebuild("due_at, priority, seq")
