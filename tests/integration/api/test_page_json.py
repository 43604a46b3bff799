"""`GET /v1/delayed` pages are written by PostgreSQL (issue 25, item 2): the daemon joins the
JSON texts the database built instead of decoding every row into Python objects, and the page
says exactly what the model-based page said for the same rows."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from scheduler.operations.task_records import TaskSummary
from scheduler.store.postgres.overview import _TASK_SUMMARY, FIRED_SQL
from tests.integration.api.harness import READ, TARGET, ApiHarness, envelope, poll

_FIXED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
BASE = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
# Odd values a page must carry unchanged: text PostgreSQL's JSON escapes differently from
# Python's if anything does (quotes, backslash, controls, non-ASCII, U+2028, an emoji), and
# instants with no, one, and every microsecond digit, far past and far ahead.
ODD = [
    ("odd-1", 'mq.t\u00e2ches."q"\\b\t\x01\x7f', BASE, None, "pending", 1),
    ("odd-2", "mq.\u2028\U0001f600.\u00e9", BASE.replace(microsecond=1), BASE, "pending", 10),
    ("odd-3", "mq.x", BASE.replace(microsecond=999_999), None, "cancelled", 5),
    ("odd-4", "mq.x", BASE.replace(microsecond=120_000), BASE, "expired", 5),
    ("odd-5", "mq.x", datetime(1970, 1, 1, 0, 0, 0, 60, tzinfo=UTC), None, "cancelled", 5),
    ("odd-6", "mq.x", datetime(9999, 12, 30, 23, 59, 59, 999_999, tzinfo=UTC), None, "dead", 5),
]


async def _insert_odd(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.executemany(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, "
            "expires_at, status, priority, attempts, org_id, created_at) "
            "VALUES ($1, $2, '{}', $3, $3, $4, $5, $6, 3, NULL, $3)",
            ODD,
        )
    finally:
        await conn.close()


async def _model_pages(dsn: str) -> list[dict[str, Any]]:
    """Every task as the model-based page wrote it: the store's rows (held, then fired)
    dumped with pydantic, the sort key dropped. Both reads share one snapshot: as two
    statements, a task the daemon fired between them was read held (claimed) and then fired
    as well, eight rows for seven tasks (issue 38)."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            held = await conn.fetch(
                f"SELECT {_TASK_SUMMARY} FROM delayed_messages ORDER BY due_at, priority, seq"
            )
            fired = await conn.fetch(FIRED_SQL, None, None, None, None, "", 100)
    finally:
        await conn.close()
    rows = [{k: v for k, v in dict(r).items() if k != "seq"} for r in [*held, *fired]]
    return [TaskSummary.model_validate(r).model_dump(mode="json") for r in rows]


async def _walk(api: ApiHarness, limit: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    for _ in range(20):
        r = await api.call("GET", "/v1/delayed", token=READ, params=params)
        assert r.status == 200, r
        items += r.body["items"]
        if r.body["next_cursor"] is None:
            return items
        params["cursor"] = r.body["next_cursor"]
    raise AssertionError("the listing never ended")


async def test_a_page_written_by_postgresql_equals_the_model_dump(
    api: ApiHarness, database_url: str
) -> None:
    """Held tasks with odd text and instants, and a fired task (nulls where its row is gone),
    listed page by page across the held/fired boundary, equal the model's dump of the same
    rows field for field, in the model's field order."""
    await api.start()
    await api.publish(TARGET, envelope(datetime.now(UTC) - timedelta(seconds=1)))
    await _insert_odd(database_url)
    want = await poll(
        lambda: _model_pages(database_url),
        lambda rows: any(row["status"] == "fired" for row in rows),
        within=10,
    )
    assert len(want) == len(ODD) + 1
    for limit in (1, 2, 500):
        got = await _walk(api, limit)
        assert got == want
        assert all(list(item) == list(TaskSummary.model_fields) for item in got)
    assert want[0]["due_at"] == "1970-01-01T00:00:00.000060Z"
    # every instant one width (six fraction digits), so the texts sort as the instants do
    instants = [w[f] for w in want for f in ("due_at", "scheduled_for", "created_at") if w[f]]
    assert instants and all(_FIXED.fullmatch(t) for t in instants), instants
    assert [w["target"] for w in want[1:3]] == [ODD[0][1], ODD[1][1]]
    assert want[2]["due_at"] == "2031-03-04T05:06:07.000001Z"
