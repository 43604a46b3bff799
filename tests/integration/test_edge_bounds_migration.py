"""Migration 0014 on real PostgreSQL: the payload reader's parallel label, org ids of old tasks,
and the unresolved dead-letter counter (issue 25, items 3 and 7)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg

from scheduler.daemon import migrate


async def _dead(conn: asyncpg.Connection, n: int, resolved: bool, tag: str = "") -> None:
    await conn.executemany(
        "INSERT INTO dead_letters (original_id, subject, payload, attempts, first_seen, "
        "resolved, raw) VALUES ($1, 'mq.delay.x', '{}', 1, now(), $2, '\\x7b7d')",
        [(f"{tag}d{resolved}{i}", resolved) for i in range(n)],
    )


async def test_migration_0014_labels_fills_and_counts(database_url: str) -> None:
    """From 0013: 0014 declares the payload reader PARALLEL UNSAFE, gives a task stored before
    0009 (no `org_id`) the org of its envelope, starts the counter at the exact unresolved
    count, and the triggers keep it exact through inserts, resolves, deletes and a truncate;
    the downgrade leaves a schema 0013 reads."""
    await asyncio.to_thread(migrate.downgrade, database_url, "0013")
    conn = await asyncpg.connect(database_url)
    try:
        due = datetime.now(UTC) + timedelta(days=1)
        for task_id, payload in (("old", b'{"org_id": "acme"}'), ("none", b"{}"), ("bad", b"\xff")):
            await conn.execute(
                "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
                "VALUES ($1, 'mq.x', $2, $3, $3)",
                task_id,
                payload,
                due,
            )
        await _dead(conn, 3, resolved=False)
        await _dead(conn, 2, resolved=True)
        await asyncio.to_thread(migrate.upgrade, database_url)

        label = "SELECT proparallel::text FROM pg_proc WHERE proname = 'scheduler_payload_field'"
        assert await conn.fetchval(label) == "u"
        rows = await conn.fetch("SELECT id, org_id FROM delayed_messages")
        orgs = {r["id"]: r["org_id"] for r in rows}
        assert orgs == {"old": "acme", "none": None, "bad": None}

        async def counted() -> int:
            return int(await conn.fetchval("SELECT unresolved FROM dead_letter_counts"))

        assert await counted() == 3
        await _dead(conn, 4, resolved=False, tag="later-")
        assert await counted() == 7
        await conn.execute("UPDATE dead_letters SET resolved = true WHERE original_id = 'dFalse0'")
        await conn.execute("UPDATE dead_letters SET resolved = false WHERE original_id = 'dTrue0'")
        assert await counted() == 7
        await conn.execute("DELETE FROM dead_letters WHERE original_id IN ('dFalse1', 'dTrue1')")
        assert await counted() == 6
        assert await counted() == await conn.fetchval(
            "SELECT count(*) FROM dead_letters WHERE NOT resolved"
        )
        await conn.execute("TRUNCATE dead_letters")
        assert await counted() == 0

        await _dead(conn, 1, resolved=False)
        await conn.execute("UPDATE dead_letters SET payload = 'null'")
        await asyncio.to_thread(migrate.downgrade, database_url, "0013")
        payload = await conn.fetchval("SELECT payload::text FROM dead_letters")
        assert payload == '{"_raw_base64": "e30="}'
        await asyncio.to_thread(migrate.upgrade, database_url)
        assert await counted() == 1
    finally:
        await conn.close()
