"""How PostgreSQL reads the management API's task listings: through indexes in firing order,
stopping at the page, whatever the table holds (EXPLAIN on a real PostgreSQL).

A listing without a status (the console's delayed page, `scheduler delayed list`) sorted every
row to return its first page; an `org_id` or due window that matches nothing read every pending
row under a generic plan; JIT compiled a listing of every partition for 200 ms. The plans are
asserted here, not the times (bench/edge_attacks.py measures what they cost firing)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from scheduler.metrics import Metrics
from scheduler.operations.stores import TaskFilter
from scheduler.store.postgres import connect as connect_module
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.overview import OverviewStore

TASKS = 20_000


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node] + [n for child in node.get("Plans", []) for n in _nodes(child)]


async def _plans_of(
    store: OverviewStore, where: TaskFilter, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    """The plan nodes of the statement `store.tasks(where, ...)` sends (explained, not run)."""
    plans: list[dict[str, Any]] = []
    run = connect_module._Connection.fetch

    async def explained(self: Any, query: str, *args: Any, **kwargs: Any) -> list[Any]:
        rows = await run(self, "EXPLAIN (FORMAT JSON) " + query, *args, **kwargs)
        plans.extend(_nodes(json.loads(rows[0][0])[0]["Plan"]))
        return []

    with monkeypatch.context() as patched:
        patched.setattr(connect_module._Connection, "fetch", explained)
        await store.tasks(where, None, 50)
    return plans


@pytest.fixture
async def listed(database_url: str) -> Any:
    """The API's pool (custom plans) over TASKS pending tasks of one organisation, a few
    cancelled ones, and fresh statistics."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, org_id) "
            "SELECT 't' || i, 'mq.tasks.s' || (i % 7), '{}'::bytea, "
            "now() + interval '1 hour' + i * interval '10 ms', now(), 'acme' "
            f"FROM generate_series(1, {TASKS}) AS i"
        )
        await conn.execute("UPDATE delayed_messages SET status = 'cancelled' WHERE seq % 1000 = 0")
        await conn.execute("ANALYZE delayed_messages")
    finally:
        await conn.close()
    pool = await create_pool(database_url, min_size=1, max_size=1, custom_plans=True)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.mark.parametrize(
    "where",
    [
        TaskFilter(),
        TaskFilter(org_id="nope"),
        TaskFilter(due_before=datetime(2000, 1, 1, tzinfo=UTC)),
        TaskFilter(status="pending", org_id="nope"),
    ],
    ids=["every_status", "org_matching_nothing", "due_window_matching_nothing", "pending_org"],
)
async def test_a_listing_reads_indexes_not_every_row(
    listed: asyncpg.Pool, where: TaskFilter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No node of the listing's plan reads the whole table: without a status each status's
    index is read in firing order (sorted every row before: seen failing), and filters that
    match nothing are answered by an index."""
    plans = await _plans_of(OverviewStore(PostgresStore(listed, Metrics())), where, monkeypatch)
    whole = [n["Node Type"] for n in plans if n.get("Relation Name") == "delayed_messages"]
    assert whole and "Seq Scan" not in whole, whole
    read = {n.get("Index Name") for n in plans if n.get("Relation Name") == "delayed_messages"}
    if where.status is None and where.org_id is None:
        assert "delayed_messages_not_ready_due" in read, read


async def test_the_apis_sessions_plan_with_their_values_and_never_compile(
    listed: asyncpg.Pool, database_url: str
) -> None:
    """The API's pool plans every statement with its parameters (a generic plan keeps every
    `$n IS NULL OR ...` filter) and runs without JIT; the engine's pools run without JIT and
    keep PostgreSQL's plan cache."""
    async with listed.acquire() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
        assert await conn.fetchval("SHOW jit") == "off"
    engine = await create_pool(database_url, min_size=1, max_size=1)
    try:
        async with engine.acquire() as conn:
            assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
            assert await conn.fetchval("SHOW jit") == "off"
    finally:
        await engine.close()
