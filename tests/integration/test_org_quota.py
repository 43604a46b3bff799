"""Per-org quotas on real NATS and PostgreSQL (issue 18 item 3): the `quota_exceeded` dead-letter
path, the org stored with each task, and migration 0009."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from scheduler.daemon import migrate
from scheduler.settings import Settings
from tests.support.hostile import LANE, envelope, hostile
from tests.support.rawclient import header_block


def frame(doc: dict[str, Any]) -> tuple[bytes, bytes]:
    return json.dumps(doc).encode(), header_block((b"Nats-Msg-Id", doc["id"].encode()))


async def org_rows(database_url: str) -> dict[str, tuple[str | None, str]]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(  # a fired task's row is gone: its tombstone says fired
            "SELECT id, org_id, status FROM delayed_messages UNION ALL "
            "SELECT id, NULL, 'fired' FROM fired_tasks"
        )
    finally:
        await conn.close()
    return {r["id"]: (r["org_id"], r["status"]) for r in rows}


async def test_a_task_over_its_orgs_quota_is_dead_lettered_and_the_rest_delivered(
    settings: Settings, database_url: str
) -> None:
    """With a quota of 2, acme's third pending task is dead-lettered `quota_exceeded` (row and
    DLQ copy naming the org and the limit); acme's first two and beta's task are stored with
    their org and delivered; once acme's have fired it may schedule again."""
    async with hostile(settings) as h:
        daemon = await h.begin(org_max_pending=2)
        due = datetime.now(UTC) + timedelta(milliseconds=800)
        acme = [envelope(due, org_id="acme") for _ in range(3)]
        beta = envelope(due, org_id="beta")
        for doc in [*acme, beta]:
            await h.publish_raw(LANE, *frame(doc))
        rows: list[asyncpg.Record] = []
        async with asyncio.timeout(10):
            while not rows:
                rows = await h.dead_rows(database_url)
                await asyncio.sleep(0.05)
        (row,) = rows
        assert row["reason"] == "quota_exceeded" and row["original_id"] == acme[2]["id"]
        assert "organisation 'acme' already has 2 pending tasks" in row["error"]
        assert h.dlq is not None
        (copy,) = await h.dlq.take(1)
        assert copy.headers is not None and copy.headers["Mq-Error-Reason"] == "quota_exceeded"
        stored = await org_rows(database_url)
        assert {i: o for i, (o, _) in stored.items()} == {
            acme[0]["id"]: "acme",
            acme[1]["id"]: "acme",
            beta["id"]: "beta",
        }
        assert h.tasks is not None
        got = await h.tasks.take(3, within=5)
        assert sorted(m.headers["Nats-Msg-Id"] for m in got) == sorted(  # type: ignore[index]
            [acme[0]["id"], acme[1]["id"], beta["id"]]
        )
        assert daemon.metrics.quota_refused.labels("acme")._value.get() == 1
        async with asyncio.timeout(10):  # fired and booked: acme's count is back to zero
            while True:
                now = await org_rows(database_url)
                if all(now[d["id"]][1] == "fired" for d in acme[:2]):
                    break
                await asyncio.sleep(0.05)
        again = envelope(datetime.now(UTC) + timedelta(milliseconds=300), org_id="acme")
        await h.publish_raw(LANE, *frame(again))
        await h.expect_delivered(again["id"], datetime.fromisoformat(again["delay_until"]))
        assert len(await h.dead_rows(database_url)) == 1


async def test_migration_0009_adds_the_org_column_and_index_and_removes_them(
    database_url: str,
) -> None:
    """Head has `delayed_messages.org_id` (nullable) and the partial index of unfinished tasks
    by org; downgrading to 0008 removes both, and upgrading restores them."""

    async def shape() -> tuple[str | None, str | None]:
        conn = await asyncpg.connect(database_url)
        try:
            nullable = await conn.fetchval(
                "SELECT is_nullable FROM information_schema.columns "
                "WHERE table_name = 'delayed_messages' AND column_name = 'org_id'"
            )
            index = await conn.fetchval(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'delayed_messages_org_open'"
            )
        finally:
            await conn.close()
        return nullable, index

    nullable, index = await shape()
    assert nullable == "YES"  # head: claimed tasks left the index (migration 0010)
    assert index is not None and "(org_id)" in index and "'in_doubt'" in index
    assert "'claimed'" not in index
    await asyncio.to_thread(migrate.downgrade, database_url, "0009")
    nullable, index = await shape()
    assert nullable == "YES"
    assert index is not None and "(org_id)" in index and "'claimed'" in index
    await asyncio.to_thread(migrate.downgrade, database_url, "0008")
    assert await shape() == (None, None)
    await migrate.upgrade_async(database_url)
    assert (await shape())[0] == "YES"
