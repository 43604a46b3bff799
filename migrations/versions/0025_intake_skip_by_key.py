"""`scheduler_intake_insert` reads each id it skips by the primary key, whatever the statistics.

Migration 0021 made the insert skip every id already stored as a task, read before it with
`WHERE NOT EXISTS (SELECT 1 FROM delayed_messages e WHERE e.id = u.id AND e.status <>
'intent')`. The planner may turn that into an anti-join, and the function's statement keeps the
generic plan it first chose: on a table that was empty when the plan was made (a fresh
deployment, a test database) that plan is a hash anti-join over a sequential scan of the whole
table, run by every later batch however large the table grew, until the next analyze replans
it. `bench/pg_task_cost.py --batch 20` measured intake at 114-207 us of PostgreSQL CPU a task
against 51-88 before 0021 (the same plan read back from PostgreSQL's `EXPLAIN`); with this
migration 37-39 us, against 34-38 for the tree before 0021 in the same sitting.

Here the subquery ends with `OFFSET 0`, which PostgreSQL never pulls up into a join: it stays a
subplan run once per row of the batch, an index probe of the primary key, in the batch's
order, with no sort left to do (the rows come out of the unnest in their ordinality). The rest
of the function is 0022's, unchanged.

Expand only: the same signature, replaced in place (`CREATE OR REPLACE`). Downgrade puts back
0022's body.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from __future__ import annotations

import runpy
from pathlib import Path

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_0022 = str(runpy.run_path(str(Path(__file__).with_name("0022_partitions.py")))["FUNCTION"])
_0022 = _0022.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)  # in place, both ways
_READ = "AND e.status <> 'intent')"
_BY_KEY = "AND e.status <> 'intent' OFFSET 0)"
assert _0022.count(_READ) == 1, "migration 0022's skip is not where this migration expects it"
FUNCTION = _0022.replace(_READ, _BY_KEY)


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute(_0022)
