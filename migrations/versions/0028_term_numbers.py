"""Term numbers unique across partitions: a high-water mark of every number issued.

`take_office` gave a term greatest(the highest epoch of the partitions it takes, floor) + 1,
so two engines taking disjoint partitions could get the same number. That was safe while a
term only ever held the partitions it took (each write is also checked against the writer's
own office), but a term that gains a partition in place (issue 37: a gain joins the running
term at the term's own number) fences the partition's former owners only if no other term
ever held that number. `partitioning.term_hwm` is the highest term number ever issued: every
take raises it and reads it in the same statement, under its row lock, and takes the next
number above it (and above the taken partitions' epochs and the floor), so no number is
issued twice (docs/leadership.md, "Term numbers").

Expand only: a column starting at the highest epoch of any partition (no number issued before
the upgrade is issued again). A previous version's take, during a rolling upgrade, does not
raise it; the next take of this version reads the partitions' epochs as well. Downgrade drops
it.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE partitioning ADD COLUMN term_hwm BIGINT NOT NULL DEFAULT 0")
    op.execute(
        "UPDATE partitioning SET term_hwm = "
        "(SELECT coalesce(max(epoch), 0) FROM partition_offices) WHERE id = 1"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE partitioning DROP COLUMN term_hwm")
