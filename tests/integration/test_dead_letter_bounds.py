"""Dead letters in PostgreSQL are bounded (issue 25, item 7): stored once and capped, pruned by
age, at most SCHEDULER_DEAD_LETTER_RATE per organisation or subject and minute (quota refusals
included), and counted in O(1)."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from scheduler.settings import Settings
from tests.integration.api.harness import poll
from tests.integration.test_daemon import aget
from tests.support.hostile import Hostile, envelope, hostile

MIB = 1024 * 1024


async def _scalar(dsn: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def _rows(dsn: str, count: int) -> list[asyncpg.Record]:
    """The dead letters, once there are `count` of them (bounded wait)."""
    rows: list[asyncpg.Record] = []
    async with asyncio.timeout(15):
        while True:
            conn = await asyncpg.connect(dsn)
            try:
                rows = list(await conn.fetch("SELECT * FROM dead_letters ORDER BY last_failed"))
            finally:
                await conn.close()
            if len(rows) >= count:
                return rows
            await asyncio.sleep(0.05)


async def _dlq_messages(h: Hostile, count: int) -> int:
    """How many copies the DLQ stream holds, once it holds `count` (bounded wait)."""
    assert h.daemon is not None
    stream = h.daemon.settings.dlq_stream
    async with asyncio.timeout(15):
        while True:
            n = int((await h.js.stream_info(stream)).state.messages)
            if n >= count:
                return n
            await asyncio.sleep(0.05)


async def _publish(h: Hostile, subject: str, payload: bytes) -> None:
    ack = await h.js.publish(subject, payload)
    assert not ack.duplicate


async def test_refusals_are_stored_once_and_capped(settings: Settings, database_url: str) -> None:
    """100 refusals of 512 KiB to one organisation's lane add under 10 MiB to `dead_letters`
    (it grew by 121 MiB: the bytes plus a base64 copy), each row keeping the first 64 KiB with
    the size received and `raw_truncated`; the DLQ stream holds the 100 whole copies."""
    async with hostile(settings) as h:
        daemon = await h.begin(dead_letter_rate=0)  # every refusal stored: measure the bytes
        size_sql = "SELECT pg_total_relation_size('dead_letters')"
        before = await _scalar(database_url, size_sql)
        body = os.urandom(512 * 1024)  # not JSON: refused `unparseable`
        for _ in range(100):
            await _publish(h, "mq.delay.org.acme.billing", body)
        rows = await _rows(database_url, 100)
        await _dlq_messages(h, 100)
        grown = await _scalar(database_url, size_sql) - before
        assert len(rows) == 100, len(rows)
        assert grown < 10 * MIB, f"dead_letters grew by {grown / MIB:.1f} MiB"
        cap = daemon.settings.dead_letter_payload_cap
        assert {(bytes(r["raw"]), r["raw_size"], r["raw_truncated"]) for r in rows} == {
            (body[:cap], len(body), True)
        }
        assert all(json.loads(r["payload"]) is None for r in rows)
        info = await h.js.stream_info(daemon.settings.dlq_stream)
        assert info.state.bytes >= 100 * len(body)


async def test_old_dead_letters_are_pruned_by_the_housekeeping(
    settings: Settings, database_url: str
) -> None:
    """At start (then hourly) the housekeeping deletes the dead letters that last failed longer
    ago than SCHEDULER_DLQ_MAX_AGE, resolved or not, keeps the younger ones, counts what it
    pruned, and the unresolved count follows."""
    conn = await asyncpg.connect(database_url)
    try:
        now = datetime.now(UTC)
        ages = {"old-1": 15, "old-2": 30, "old-3": 15, "young": 13}
        for name, days in ages.items():
            await conn.execute(
                "INSERT INTO dead_letters (original_id, subject, payload, attempts, first_seen, "
                "last_failed, resolved) VALUES ($1, 'mq.delay.x', 'null', 1, $2, $2, $3)",
                name,
                now - timedelta(days=days),
                name == "old-3",
            )
        assert await conn.fetchval("SELECT unresolved FROM dead_letter_counts") == 3
    finally:
        await conn.close()
    async with hostile(settings) as h:
        daemon = await h.begin(dlq_max_age=timedelta(days=14))
        pruned = daemon.metrics.dead_letters_pruned._value

        async def count() -> float:
            return float(pruned.get())

        await poll(count, lambda n: n >= 3, within=10)
        left = await _rows(database_url, 1)
        assert [r["original_id"] for r in left] == ["young"]
        unresolved = await _scalar(database_url, "SELECT unresolved FROM dead_letter_counts")
        assert unresolved == 1
        assert daemon.metrics.dead_letters_pruned._value.get() == 3


async def test_refusals_past_the_rate_are_counted_not_stored(
    settings: Settings, database_url: str
) -> None:
    """With SCHEDULER_DEAD_LETTER_RATE=2, 12 refusals to organisation acme's lane store 2 rows
    and count 10 in `dead_letters_unstored_total{org="acme"}`, while organisation beta's 2 are
    stored (its own budget); all 14 copies reach the DLQ stream."""
    async with hostile(settings) as h:
        daemon = await h.begin(dead_letter_rate=2)
        for _ in range(12):
            await _publish(h, "mq.delay.org.acme.billing", b"{not json")
        for _ in range(2):
            await _publish(h, "mq.delay.org.beta.billing", b"{not json")
        assert await _dlq_messages(h, 14) == 14
        rows = await _rows(database_url, 4)
        assert sorted(r["subject"] for r in rows) == 2 * ["mq.delay.org.acme.billing"] + 2 * [
            "mq.delay.org.beta.billing"
        ]
        unstored = daemon.metrics.dead_letters_unstored
        assert unstored.labels("acme", "unparseable")._value.get() == 10
        assert unstored.labels("beta", "unparseable")._value.get() == 0
        assert daemon.endpoints.metrics is not None
        _, body = await aget(daemon.endpoints.metrics.url + "/metrics")
        text = body.decode()
        assert (
            'mq_scheduler_dead_letters_unstored_total{org="acme",reason="unparseable"} 10.0' in text
        )


async def test_quota_refusals_are_bounded_the_same_way(
    settings: Settings, database_url: str
) -> None:
    """An organisation at its quota (SCHEDULER_ORG_MAX_PENDING=1) keeps publishing: of its 6
    refused tasks only SCHEDULER_DEAD_LETTER_RATE=2 become rows; the rest are counted as
    `quota_exceeded` and still copied to the DLQ stream."""
    async with hostile(settings) as h:
        daemon = await h.begin(dead_letter_rate=2, org_max_pending=1)
        due = datetime.now(UTC) + timedelta(hours=1)
        for _ in range(7):
            doc = envelope(due, org_id="acme")
            await _publish(h, "mq.delay.org.acme.jobs", json.dumps(doc).encode())
        assert await _dlq_messages(h, 6) == 6
        rows = await _rows(database_url, 2)
        assert [r["reason"] for r in rows] == ["quota_exceeded", "quota_exceeded"]
        unstored = daemon.metrics.dead_letters_unstored.labels("acme", "quota_exceeded")
        assert unstored._value.get() == 4
        stored = await _scalar(database_url, "SELECT count(*) FROM delayed_messages")
        assert stored == 1
