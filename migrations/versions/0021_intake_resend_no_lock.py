"""`scheduler_intake_insert` leaves the rows of stored tasks unlocked.

The function of migration 0019 inserts a batch with `ON CONFLICT (id) DO UPDATE ... WHERE
d.status = 'intent'`: a task takes over its id's intent row, and any other row is left alone.
But `ON CONFLICT DO UPDATE` locks the conflicting row before it evaluates its `WHERE`, and keeps
the lock to the end of the transaction even when it changes nothing. A batch of resends (lane
redeliveries, which come in a stretch after a NATS node froze) therefore locked due tasks in
the batch's order while a claim locked the same rows in its own: PostgreSQL found the cycle and
failed the claim (`deadlock detected`, 161 tasks sent again a claim later, seen in the
cluster fault test of a frozen node).

Here the insert skips every id already stored as a task (not an intent), read without a lock
before the insert: such a resend stores nothing, as before (the caller judges it an exact
resend or a conflict from the row), and locks nothing. A task stored by another statement
between that read and the insert still conflicts, and is locked and left alone as before: a
lock there needs two intakes of one id at once, not a claim. The rows go in in the batch's order
(`WITH ORDINALITY`, `ORDER BY`), as 0019's plan inserted them: the read must not let the planner
reorder them (a hash anti-join would). The rest of the function is 0019's, unchanged.

Expand only: the same signature, replaced in place (`CREATE OR REPLACE`); the previous
version calls it the same way. Downgrade puts back 0019's body.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03
"""

from __future__ import annotations

import runpy
from pathlib import Path

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_0019 = str(runpy.run_path(str(Path(__file__).with_name("0019_intake_insert.py")))["FUNCTION"])
_0019 = _0019.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)  # in place, both ways
_FROM = """            AS u(id, target, payload, headers, priority, due_us, sched_us, exp_us, org_id)
        ON CONFLICT (id)"""
_SKIP = """            WITH ORDINALITY
            AS u(id, target, payload, headers, priority, due_us, sched_us, exp_us, org_id, n)
        WHERE NOT EXISTS (SELECT 1 FROM delayed_messages e WHERE e.id = u.id
            AND e.status <> 'intent')
        ORDER BY u.n
        ON CONFLICT (id)"""
assert _0019.count(_FROM) == 1, "migration 0019's insert is not where this migration expects it"
FUNCTION = _0019.replace(_FROM, _SKIP)


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute(_0019)
