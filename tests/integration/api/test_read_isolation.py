"""Operator reads never make deliveries late (issue 25, item 2): the API queries on its own
small pool with a statement timeout, and a bound on concurrent API requests answers 503 with
Retry-After at once. `/v1/stats` counted once per interval for all callers and the rows budget
run on the twins (tests/unit/test_read_bounds_api.py)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.operations.stores import Listed
from scheduler.store.postgres.connect import PostgresStore
from scheduler.store.postgres.overview import OverviewStore
from tests.integration.api.harness import READ, TARGET, ApiHarness, Reply, envelope
from tests.support.helpers import wait_until

PENDING = {"status": "pending", "limit": 500}


def slow_task_lists(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[PostgresStore]:
    """Make every task listing sleep `seconds` inside PostgreSQL first (pg_sleep on the
    connection the listing runs on); returns the stores of the listings begun so far, each
    recorded before it asks its pool for a connection."""
    begun: list[PostgresStore] = []
    real = OverviewStore.tasks

    async def slow(self: OverviewStore, *args: Any) -> list[Listed]:
        begun.append(self.db)
        async with self.db.timed("test_sleep") as conn:
            await conn.execute("SELECT pg_sleep($1)", seconds)
        return await real(self, *args)

    monkeypatch.setattr(OverviewStore, "tasks", slow)
    return begun


async def list_pending(api: ApiHarness) -> Reply:
    return await api.call("GET", "/v1/delayed", token=READ, params=PENDING)


async def test_a_burst_of_slow_reads_does_not_delay_a_delivery(
    api: ApiHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a dozen slow task listings in flight, a task due now is delivered within a second:
    the listings run on the API's own pool, never on the engine's connections."""
    daemon = await api.start()
    await wait_until(lambda: daemon.office is not None and daemon.office.may_act(), within=10)
    begun = slow_task_lists(monkeypatch, 2.5)
    readers = [asyncio.create_task(list_pending(api)) for _ in range(12)]
    try:
        await wait_until(lambda: len(begun) >= 3, within=5)
        published = datetime.now(UTC)
        task = envelope(published)
        await api.publish(TARGET, task)
        psub = await api.js.pull_subscribe(TARGET, durable=None, stream="TASKS")
        msgs = await psub.fetch(1, timeout=5)
        await psub.unsubscribe()
    finally:
        replies = await asyncio.gather(*readers)
    assert [(m.headers or {})["Nats-Msg-Id"] for m in msgs] == [task["id"]]
    fired = datetime.fromisoformat((msgs[0].headers or {})["Mq-Fired-At"].replace("Z", "+00:00"))
    assert fired - published < timedelta(seconds=1), f"delivered {fired - published} late"
    assert begun and all(store is not daemon.store for store in begun)
    assert {r.status for r in replies} <= {200, 503}, replies


async def test_a_request_over_the_bound_gets_503_with_retry_after_at_once(
    api: ApiHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SCHEDULER_API_MAX_CONCURRENT (8) requests running, one more is answered 503
    `overloaded` with Retry-After in well under a second; once they end, reads answer again
    (the rows budget, which would charge their 16 s of statements, is off)."""
    await api.start(api_read_rows_per_second=0)
    begun = slow_task_lists(monkeypatch, 2.0)
    running = [asyncio.create_task(list_pending(api)) for _ in range(8)]
    try:
        await wait_until(lambda: len(begun) == 8, within=5)
        started = time.monotonic()
        extra = await list_pending(api)
        took = time.monotonic() - started
    finally:
        replies = await asyncio.gather(*running)
    assert extra.status == 503, extra
    assert took < 0.5, f"the refusal took {took:.2f}s"
    assert extra.body["code"] == "overloaded"
    assert "SCHEDULER_API_MAX_CONCURRENT" in extra.body["detail"]
    assert extra.headers["Content-Type"] == "application/problem+json"
    assert int(extra.headers["Retry-After"]) >= 1
    assert len(begun) == 8, "the refused request ran its query anyway"
    assert [r.status for r in replies] == [200] * 8
    assert (await list_pending(api)).status == 200


async def test_a_slow_statement_is_cut_and_answered_503(
    api: ApiHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing whose statement outlasts SCHEDULER_API_STATEMENT_TIMEOUT (5 s) is cancelled
    by PostgreSQL and answered 503 `query_timeout` with Retry-After, not a 500 or a hang."""
    await api.start()
    slow_task_lists(monkeypatch, 8.0)
    started = time.monotonic()
    reply = await list_pending(api)
    took = time.monotonic() - started
    assert reply.status == 503, reply
    assert reply.body["code"] == "query_timeout", reply
    assert "SCHEDULER_API_STATEMENT_TIMEOUT" in reply.body["detail"]
    assert int(reply.headers["Retry-After"]) >= 1
    assert 4.5 < took < 7.0, f"answered after {took:.2f}s"
