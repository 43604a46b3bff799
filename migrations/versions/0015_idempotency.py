"""`api_idempotency`: the first outcome of each management-API write sent with an
`Idempotency-Key`, so a client's retry gets that outcome again instead of a second effect.

One row per (scope, key): `scope` is the caller (the token kind), `route` and `target` the call
and the object it named, `fingerprint` a hash of method, route, target and body, so the same key
on another request is refused. A row is `running` while its first request runs (`owner` names
that request; `locked_until` bounds how long a crashed one blocks a retry) and `done` with the
answer's status and body once it finished. `first_at` is the instant the first request began
(a retried manual trigger reuses it). Rows live until `expires_at` (24 h after the first
request), then the daemon's hourly upkeep deletes them (index on `expires_at`).

Expand only: a new table the previous version never reads. Downgrade drops it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE api_idempotency (
            scope        TEXT NOT NULL,
            key          TEXT NOT NULL,
            route        TEXT NOT NULL,
            target       TEXT NOT NULL,
            fingerprint  TEXT NOT NULL,
            state        TEXT NOT NULL CHECK (state IN ('running', 'done')),
            owner        UUID NOT NULL,
            first_at     TIMESTAMPTZ NOT NULL,
            locked_until TIMESTAMPTZ NOT NULL,
            expires_at   TIMESTAMPTZ NOT NULL,
            status       INTEGER,
            media_type   TEXT,
            body         BYTEA,
            PRIMARY KEY (scope, key)
        )
        """
    )
    op.execute("CREATE INDEX api_idempotency_expires ON api_idempotency (expires_at)")


def downgrade() -> None:
    op.execute("DROP TABLE api_idempotency")
