"""The org filter of `GET /v1/delayed` under a parallel plan (issue 25, item 3)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.integration.api.harness import READ, TARGET, ApiHarness

ROWS = 3000
# Every plan that can run in parallel does: PostgreSQL's costs of starting workers set to zero
# and any table big enough for a parallel scan (applies to the connections opened after it).
PARALLEL = (
    "parallel_setup_cost = 0",
    "parallel_tuple_cost = 0",
    "min_parallel_table_scan_size = 0",
    "min_parallel_index_scan_size = 0",
    "max_parallel_workers_per_gather = 2",
)


async def _fill(dsn: str, due: datetime) -> None:
    """`ROWS` pending tasks, every third one of organisation `acme`, and the parallel settings
    on the database for every connection the daemon opens after this."""
    conn = await asyncpg.connect(dsn)
    try:
        name = await conn.fetchval("SELECT current_database()")
        for setting in PARALLEL:
            await conn.execute(f'ALTER DATABASE "{name}" SET {setting}')
        await conn.executemany(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, org_id) "
            "VALUES ($1, $2, $3, $4, $4, $5)",
            [_row(i, due) for i in range(ROWS)],
        )
        await conn.execute("ANALYZE delayed_messages")
    finally:
        await conn.close()


def _row(i: int, due: datetime) -> tuple[str, str, bytes, datetime, str]:
    org = "acme" if i % 3 == 0 else f"org-{i % 7}"
    doc = {"schema": "hanzo.mq.v1", "id": f"task-{i:05d}", "org_id": org, "data": {}}
    return f"task-{i:05d}", TARGET, json.dumps(doc).encode(), due + timedelta(seconds=i), org


async def test_org_filter_answers_under_a_parallel_plan(api: ApiHarness, database_url: str) -> None:
    """With PostgreSQL free to plan the listing in parallel, `org_id=acme` lists exactly acme's
    tasks, in firing order, page after page (it answered 500 `cannot start subtransactions
    during a parallel operation` while the filter parsed every stored envelope)."""
    due = datetime.now(UTC) + timedelta(days=3)
    await _fill(database_url, due)
    await api.start()
    want = [f"task-{i:05d}" for i in range(0, ROWS, 3)]
    got: list[str] = []
    params: dict[str, object] = {"org_id": "acme", "limit": 500}
    for _ in range(5):
        r = await api.call("GET", "/v1/delayed", token=READ, params=params)
        assert r.status == 200, r
        got += [t["id"] for t in r.body["items"]]
        if not r.body["next_cursor"]:
            break
        params["cursor"] = r.body["next_cursor"]
    assert got == want
    r = await api.call("GET", "/v1/delayed", token=READ, params={"org_id": "nobody"})
    assert r.status == 200 and r.body["items"] == [], r
