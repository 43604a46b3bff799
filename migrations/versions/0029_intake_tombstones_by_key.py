"""`scheduler_intake_insert` plans its tombstone lookup at each call, by the table's size then.

After the insert, the function deletes again every task it just stored that has a tombstone in
`fired_tasks` (a resend of a task fired meanwhile, migration 0021). That statement read
`SELECT f.id FROM fired_tasks f WHERE f.id = ANY(got_ids)`, and the function's statement keeps
the generic plan it first chose: planned while `fired_tasks` was analyzed small (a fresh
deployment's first minute, a test database), it is a sequential scan of the whole table with
the array as a filter, run by every later intake batch however large the table grew (every
fired task leaves a tombstone there for the duplicate window), until the next analyze of
`fired_tasks` replans it. Seen in `bench/partitions.py` with `auto_explain`: "Seq Scan on
fired_tasks, Rows Removed by Filter: 998" in every batch, about 2 ms a call at 600 tasks/s,
the function's second most expensive statement; three engines storing a third of the tasks
each call it three times as often.

Here the lookup is planned at every call (`EXECUTE`: dynamic SQL keeps no plan) with the
batch's ids and the table's size at that moment: a scan of one page while the table is that
small, the primary key once it has grown, whatever its last analyze said (the planner scales
the analyzed row count by the table's current pages). Planning it costs some tens of
microseconds a batch. The delete, which finds something only for such a resend, runs only
then, by the ids found. The rest of the function is 0025's, unchanged.

Expand only: the same signature, replaced in place (`CREATE OR REPLACE`). Downgrade puts back
0025's body.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""

from __future__ import annotations

import runpy
from pathlib import Path

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

_0025 = str(runpy.run_path(str(Path(__file__).with_name("0025_intake_skip_by_key.py")))["FUNCTION"])
_SCAN = """    WITH t AS (SELECT f.id FROM fired_tasks f WHERE f.id = ANY(got_ids)),
    del AS (DELETE FROM delayed_messages d USING t WHERE d.id = t.id RETURNING d.id)
    SELECT array_agg(del.id) INTO gone FROM del;
"""
_BY_KEY = """    EXECUTE 'SELECT array_agg(f.id) FROM fired_tasks f WHERE f.id = ANY($1)'
        INTO gone USING got_ids;
    IF gone IS NOT NULL THEN  -- stored by this statement: each one is there to delete
        DELETE FROM delayed_messages d WHERE d.id = ANY(gone);
    END IF;
"""
assert _0025.count(_SCAN) == 1, "migration 0025's tombstone lookup is not where 0029 expects it"
FUNCTION = _0025.replace(_SCAN, _BY_KEY)


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute(_0025)
