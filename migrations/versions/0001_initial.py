"""Delayed messages, the partitioned fire log with its upkeep function, dead letters.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

DELAYED = """
CREATE TABLE delayed_messages (
    id            TEXT PRIMARY KEY,
    target        TEXT NOT NULL,
    payload       BYTEA NOT NULL,
    headers       JSONB NOT NULL DEFAULT '{}'::jsonb,
    priority      SMALLINT NOT NULL DEFAULT 5 CHECK (priority BETWEEN 1 AND 10),
    due_at        TIMESTAMPTZ NOT NULL,
    expires_at    TIMESTAMPTZ,
    seq           BIGSERIAL NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending' CHECK (status IN
                  ('pending', 'claimed', 'fired', 'cancelled', 'expired', 'dead')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    claimed_epoch BIGINT,
    claimed_at    TIMESTAMPTZ,
    fired_at      TIMESTAMPTZ,
    stream_seq    BIGINT,
    last_error    TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX delayed_messages_pending_due
    ON delayed_messages (due_at, priority, seq) WHERE status = 'pending';
CREATE INDEX delayed_messages_claimed
    ON delayed_messages (due_at, priority, seq) WHERE status = 'claimed';
"""

FIRE_LOG = """
CREATE SEQUENCE fire_log_id_seq;
CREATE TABLE fire_log (
    id            BIGINT NOT NULL DEFAULT nextval('fire_log_id_seq'),
    kind          TEXT NOT NULL CHECK (kind IN ('cron', 'delayed')),
    key           TEXT NOT NULL,
    subject       TEXT NOT NULL,
    scheduled_for TIMESTAMPTZ NOT NULL,
    fired_at      TIMESTAMPTZ NOT NULL,
    attempt       INTEGER NOT NULL,
    epoch         BIGINT NOT NULL,
    instance      TEXT NOT NULL,
    stream        TEXT,
    stream_seq    BIGINT,
    PRIMARY KEY (id, fired_at)
) PARTITION BY RANGE (fired_at);
ALTER SEQUENCE fire_log_id_seq OWNED BY fire_log.id;
CREATE TABLE fire_log_default PARTITION OF fire_log DEFAULT;
CREATE INDEX fire_log_key ON fire_log (key, scheduled_for);
CREATE INDEX fire_log_fired_at ON fire_log (fired_at);
"""

# Creates the daily partitions from today to `ahead_days` ahead (moving any rows the default
# partition already holds for that day) and drops partitions older than `retention_days`.
UPKEEP = """
CREATE FUNCTION scheduler_fire_log_upkeep(retention_days INTEGER, ahead_days INTEGER)
RETURNS TABLE (action TEXT, partition_name TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    today DATE := (now() AT TIME ZONE 'UTC')::date;
    d DATE;
    lo TIMESTAMPTZ;
    hi TIMESTAMPTZ;
    name TEXT;
    part RECORD;
BEGIN
    FOR i IN 0..ahead_days LOOP
        d := today + i;
        name := 'fire_log_p' || to_char(d, 'YYYYMMDD');
        IF to_regclass(name) IS NULL THEN
            lo := d::timestamp AT TIME ZONE 'UTC';
            hi := (d + 1)::timestamp AT TIME ZONE 'UTC';
            EXECUTE format('CREATE TABLE %I (LIKE fire_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
            EXECUTE format('WITH moved AS (DELETE FROM fire_log_default WHERE fired_at >= %L AND fired_at < %L RETURNING *) INSERT INTO %I SELECT * FROM moved', lo, hi, name);
            EXECUTE format('ALTER TABLE fire_log ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name, lo, hi);
            action := 'created'; partition_name := name; RETURN NEXT;
        END IF;
    END LOOP;
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'fire_log'::regclass AND c.relname ~ '^fire_log_p[0-9]{8}$'
    LOOP
        IF to_date(substr(part.relname, 11), 'YYYYMMDD') < today - retention_days THEN
            EXECUTE format('DROP TABLE %I', part.relname);
            action := 'dropped'; partition_name := part.relname; RETURN NEXT;
        END IF;
    END LOOP;
END $$;
"""

DEAD_LETTERS = """
CREATE TABLE dead_letters (
    id          UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    original_id TEXT NOT NULL,
    subject     TEXT NOT NULL,
    payload     JSONB NOT NULL,
    error       TEXT,
    attempts    INTEGER NOT NULL,
    first_seen  TIMESTAMPTZ NOT NULL,
    last_failed TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved    BOOLEAN NOT NULL DEFAULT false,
    -- beyond the platform standard:
    reason      TEXT NOT NULL DEFAULT 'unknown',
    stage       TEXT NOT NULL DEFAULT 'intake' CHECK (stage IN ('intake', 'firing', 'replay')),
    target      TEXT,
    raw         BYTEA,
    headers     JSONB NOT NULL DEFAULT '{}'::jsonb,
    replayed_at TIMESTAMPTZ,
    resolved_at TIMESTAMPTZ,
    resolved_by TEXT
);
CREATE INDEX dead_letters_unresolved ON dead_letters (last_failed) WHERE NOT resolved;
CREATE INDEX dead_letters_original ON dead_letters (original_id);
"""


def _each(block: str) -> None:
    """asyncpg runs one statement per call."""
    for statement in block.split(";\n"):
        if statement.strip():
            op.execute(statement)


def upgrade() -> None:
    _each(DELAYED)
    _each(FIRE_LOG)
    op.execute(UPKEEP)
    op.execute("SELECT scheduler_fire_log_upkeep(14, 2)")
    _each(DEAD_LETTERS)


def downgrade() -> None:
    op.execute("DROP TABLE dead_letters")
    op.execute("DROP FUNCTION scheduler_fire_log_upkeep(INTEGER, INTEGER)")
    op.execute("DROP TABLE fire_log")
    op.execute("DROP TABLE delayed_messages")
