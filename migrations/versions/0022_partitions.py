"""Partitions, their storage (issue 37): every task and cron job row holds its partition, the
deployment records its partition count, and intake's function stores each task's partition.

- `delayed_messages.partition` and `schedules.partition`: SMALLINT NOT NULL DEFAULT 0, a
  catalogue change (a constant default rewrites and scans nothing). Every existing row, and
  every row the previous version inserts while the Deployment rolls, is in partition 0, which
  is `partition_of(key, 1)` (scheduler/partitions.py): right under P = 1.
- `partitioning`: one row, the deployment's partition count (1..4096), recorded as 1, the count
  every existing row was stored under. An engine whose SCHEDULER_PARTITIONS differs refuses to
  start (scheduler/store/postgres/partitioning.py): its rows would sit in other partitions than
  the rule gives, and changing the count means moving them, which nothing does yet.
- No index by partition yet: nothing reads the column until claims go by partition, and an
  index nobody reads would cost each task an index entry at intake (about 2.5 us of
  PostgreSQL CPU, migration 0010's measure). The migration that moves claims to partitions
  adds it (and can drop the pending index it replaces).
- `scheduler_intake_insert(..., new_partitions SMALLINT[])`: the function of 0021 with a tenth
  argument, each task's partition (NULL: all in partition 0, how P = 1 passes it, nothing per
  row). An intent row (a cancel or reschedule for a task still on the lane) is written in
  partition 0; the task taking it over gives it the task's partition. The nine-argument
  function stays, unchanged, for the previous version during a rolling upgrade (it stores
  partition 0, right under the only count that runs); a later migration may drop it.

Expand only: new columns with defaults, a new table and a function the previous version never
reads. Downgrade drops them all.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

import runpy
from pathlib import Path

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

SIGNATURE = (
    "scheduler_intake_insert(TEXT[], TEXT[], BYTEA[], JSONB[], SMALLINT[], BIGINT[], BIGINT[], "
    "BIGINT[], TEXT[], SMALLINT[])"
)

PARTITIONING = """
CREATE TABLE partitioning (
    id          SMALLINT PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    partitions  INTEGER NOT NULL CHECK (partitions BETWEEN 1 AND 4096),
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""

_0021_PATH = Path(__file__).with_name("0021_intake_resend_no_lock.py")
_0021 = str(runpy.run_path(str(_0021_PATH))["FUNCTION"])
# (0021's text, what this migration puts in its place): each must occur exactly once
_EDITS = (
    ("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION"),
    ("new_org_ids TEXT[]\n)", "new_org_ids TEXT[], new_partitions SMALLINT[]\n)"),
    ("scheduled_for, expires_at, org_id)", "scheduled_for, expires_at, org_id, partition)"),
    ("u.exp_us * interval '1 microsecond', u.org_id\n",
     "u.exp_us * interval '1 microsecond', u.org_id, COALESCE(u.partition, 0)\n"),
    ("new_exp_us, new_org_ids)", "new_exp_us, new_org_ids, new_partitions)"),
    ("exp_us, org_id, n)", "exp_us, org_id, partition, n)"),
    ("org_id = excluded.org_id,", "org_id = excluded.org_id, partition = excluded.partition,"),
)  # fmt: skip
FUNCTION = _0021
for _old, _new in _EDITS:
    assert FUNCTION.count(_old) == 1, f"migration 0021's function has no single {_old!r}"
    FUNCTION = FUNCTION.replace(_old, _new)


def upgrade() -> None:
    for table in ("delayed_messages", "schedules"):
        op.execute(f"ALTER TABLE {table} ADD COLUMN partition SMALLINT NOT NULL DEFAULT 0")
    op.execute(PARTITIONING)
    op.execute("INSERT INTO partitioning (id, partitions) VALUES (1, 1)")
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.execute("DROP TABLE partitioning")
    for table in ("schedules", "delayed_messages"):
        op.execute(f"ALTER TABLE {table} DROP COLUMN partition")
