"""Bounds at the edge: the org filter on its column, dead letters stored once, capped and pruned.

1. `scheduler_payload_field` (migration 0005) has an `EXCEPTION` block, which starts a
   subtransaction, and PostgreSQL refuses one during a parallel operation: declared `PARALLEL
   SAFE`, any query that called it under a parallel plan failed ("cannot start subtransactions
   during a parallel operation"). PostgreSQL's manual (Parallel Labeling) asks `PARALLEL
   UNSAFE` of a function that changes the transaction state even temporarily, as an `EXCEPTION`
   block does (`RESTRICTED` is not enough: the leader process runs in parallel mode too). The
   API's org filter now compares `delayed_messages.org_id` (migration 0009); the tasks stored
   before 0009 get theirs here, read from their envelopes once (a scan of the rows whose
   `org_id` is NULL).
2. `dead_letters` gets `raw_size` (the message's size as received; NULL: the row predates this
   and `raw` is whole) and `raw_truncated` (true when `raw` keeps only the first
   `SCHEDULER_DEAD_LETTER_PAYLOAD_CAP` bytes: the DLQ stream holds the whole copy). From this
   version `payload` holds JSON `null` and readers derive the document from `raw`: the bytes are
   stored once, not twice (raw plus a JSON or base64 copy).
3. `dead_letters_age` on `(last_failed, id)`: the housekeeping prunes by age in small batches
   over it, and the newest-first listing reads it backwards.
4. `dead_letter_counts`: the number of unresolved dead letters, kept by statement triggers on
   `dead_letters` (every version's writes go through them), so `/v1/stats` and the gauge read
   one row however many dead letters there are.

Expand only (docs/deploy.md): the previous version keeps writing `payload` documents and
reading `payload` and `raw` as before; its rows have `raw_size` NULL and `raw_truncated` false;
its unresolved count reads the partial index as before. The table is locked (share row
exclusive, as creating a trigger does anyway) while the counter starts from the exact count.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

PAYLOAD_FIELD = "scheduler_payload_field(BYTEA, TEXT)"
AGE_INDEX = "dead_letters_age"
COUNT_FUNCTION = "scheduler_dead_letters_count()"

# One function for the four triggers: PL/pgSQL plans each statement when it first runs, so
# the branch for another event never touches a transition table its trigger lacks.
COUNT = """
CREATE FUNCTION scheduler_dead_letters_count() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    delta BIGINT := 0;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE dead_letter_counts SET unresolved = 0 WHERE id = 1;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        delta := delta + (SELECT count(*) FROM new_rows WHERE NOT resolved);
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        delta := delta - (SELECT count(*) FROM old_rows WHERE NOT resolved);
    END IF;
    IF delta <> 0 THEN
        UPDATE dead_letter_counts SET unresolved = unresolved + delta WHERE id = 1;
    END IF;
    RETURN NULL;
END $$
"""

TRIGGERS = {
    "dead_letters_count_insert": "AFTER INSERT ON dead_letters REFERENCING NEW TABLE AS new_rows",
    "dead_letters_count_update": (
        "AFTER UPDATE ON dead_letters REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"
    ),
    "dead_letters_count_delete": "AFTER DELETE ON dead_letters REFERENCING OLD TABLE AS old_rows",
    "dead_letters_count_truncate": "AFTER TRUNCATE ON dead_letters",
}


def upgrade() -> None:
    op.execute(f"ALTER FUNCTION {PAYLOAD_FIELD} PARALLEL UNSAFE")
    op.execute(
        "UPDATE delayed_messages SET org_id = scheduler_payload_field(payload, 'org_id') "
        "WHERE org_id IS NULL AND scheduler_payload_field(payload, 'org_id') IS NOT NULL"
    )
    op.execute(
        "ALTER TABLE dead_letters ADD COLUMN raw_size INTEGER, "
        "ADD COLUMN raw_truncated BOOLEAN NOT NULL DEFAULT false"
    )
    op.execute(f"CREATE INDEX {AGE_INDEX} ON dead_letters (last_failed, id)")
    op.execute("LOCK TABLE dead_letters IN SHARE ROW EXCLUSIVE MODE")
    op.execute(
        "CREATE TABLE dead_letter_counts (id SMALLINT PRIMARY KEY CHECK (id = 1), "
        "unresolved BIGINT NOT NULL)"
    )
    op.execute(
        "INSERT INTO dead_letter_counts (id, unresolved) "
        "SELECT 1, count(*) FROM dead_letters WHERE NOT resolved"
    )
    op.execute(COUNT)
    for name, event in TRIGGERS.items():
        op.execute(
            f"CREATE TRIGGER {name} {event} FOR EACH STATEMENT EXECUTE FUNCTION {COUNT_FUNCTION}"
        )


def downgrade() -> None:
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER {name} ON dead_letters")
    op.execute(f"DROP FUNCTION {COUNT_FUNCTION}")
    op.execute("DROP TABLE dead_letter_counts")
    op.execute(f"DROP INDEX {AGE_INDEX}")
    # The previous version reads `payload`: give back the documents this version left out.
    op.execute(
        "UPDATE dead_letters SET payload = jsonb_build_object('_raw_base64', "
        "encode(raw, 'base64')) WHERE payload = 'null'::jsonb AND raw IS NOT NULL"
    )
    op.execute("ALTER TABLE dead_letters DROP COLUMN raw_size, DROP COLUMN raw_truncated")
    # `scheduler_payload_field` stays PARALLEL UNSAFE: the 0005 declaration was the bug, and
    # the previous version's filter only gets slower-but-correct plans with it.
