"""A claim becomes a heap-only-tuple (HOT) update: claimed = `claimed_epoch` set on a ready row.

From this version the claim leaves `status` (`pending` or `in_doubt`) alone and marks the task
by `claimed_epoch` (with `claimed_at`, `attempts`, `updated_at`): no indexed column and no
column of an index predicate changes, so PostgreSQL writes the new row version on the same page
without any index entry, when the page has room for it. `fillfactor = 45` leaves that room: a
page holds tasks inserted together, which fall due and are claimed together, and each needs
room for its whole new version (payload included). Only pages written from now on get it; a
rewrite (VACUUM FULL, pg_repack) repacks the existing ones. See
docs/decisions/2026-11-26-hot-claim.md for the measurements.

Expand only, as docs/deploy.md asks of a migration (the previous version still runs while the
Deployment rolls): `delayed_messages_claimed` stays, empty from now on except for the rows the
previous version claims meanwhile, which the new code reports as claimed and takes over
(`TaskStore.reclaim_orphans`) through it; a later migration may drop it. Rows already claimed
are left `claimed` for the same reason. The upgrade clears `claimed_epoch` on pending and
in-doubt rows (the previous version left it on a task put back by a retry, where nothing read
it; now it would mean claimed): one scan of `delayed_messages`.

Downgrade: tasks claimed the new way become `claimed` again (the previous version takes over
only those), and the default fillfactor is restored for new pages.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

READY = "('pending', 'in_doubt')"


def upgrade() -> None:
    op.execute(
        "UPDATE delayed_messages SET claimed_epoch = NULL "
        f"WHERE status IN {READY} AND claimed_epoch IS NOT NULL"
    )
    op.execute("ALTER TABLE delayed_messages SET (fillfactor = 45)")


def downgrade() -> None:
    op.execute(
        "UPDATE delayed_messages SET status = 'claimed' "
        f"WHERE status IN {READY} AND claimed_epoch IS NOT NULL"
    )
    op.execute("ALTER TABLE delayed_messages RESET (fillfactor)")
