"""Epochs per partition (issue 37, docs/decisions/2026-12-06-partition-ownership.md, step 1).

- `partition_offices (partition, epoch, instance, since)`: one row per partition 0..P-1 (P as
  `partitioning` records it), each the fencing epoch of its partition. Every row starts from
  today's `leadership` row (its epoch, instance and since): no epoch a leader held before the
  upgrade can pass the fence of any partition afterwards.
- `leadership` becomes a view of partition 0's row (`id` is always 1). A simple view is
  updatable in PostgreSQL, so the previous version, still running while the Deployment rolls,
  takes office (`UPDATE leadership ... SET epoch = ...`) and fences its writes (`SELECT epoch
  FROM leadership WHERE id = 1 AND epoch = $1 FOR SHARE`) on partition 0's row, the very row
  the new version locks under P = 1: old and new engines fence each other during the upgrade
  as two engines of one version do. Readers of the leader (the overview, a manual cron row's
  epoch) read it unchanged.

Downgrade puts the table back with the highest epoch of any partition (an epoch is never
reissued) and partition 0's instance and since, and drops `partition_offices`.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

OFFICES = """
CREATE TABLE partition_offices (
    partition SMALLINT PRIMARY KEY CHECK (partition BETWEEN 0 AND 4095),
    epoch     BIGINT NOT NULL DEFAULT 0,
    instance  TEXT,
    since     TIMESTAMPTZ
)
"""

VIEW = (
    "CREATE VIEW leadership AS SELECT 1::smallint AS id, epoch, instance, since "
    "FROM partition_offices WHERE partition = 0"
)

LEADERSHIP = """
CREATE TABLE leadership (
    id       SMALLINT PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    epoch    BIGINT NOT NULL DEFAULT 0,
    instance TEXT,
    since    TIMESTAMPTZ
)
"""


def upgrade() -> None:
    op.execute(OFFICES)
    op.execute(
        "INSERT INTO partition_offices (partition, epoch, instance, since) "
        "SELECT p, l.epoch, l.instance, l.since FROM leadership l, partitioning n, "
        "generate_series(0, n.partitions - 1) AS p WHERE l.id = 1 AND n.id = 1"
    )
    op.execute("DROP TABLE leadership")
    op.execute(VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW leadership")
    op.execute(LEADERSHIP)
    op.execute(
        "INSERT INTO leadership (id, epoch, instance, since) SELECT 1, "
        "(SELECT max(epoch) FROM partition_offices), instance, since "
        "FROM partition_offices WHERE partition = 0"
    )
    op.execute("DROP TABLE partition_offices")
