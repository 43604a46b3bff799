"""Operator reads bounded, in-process on the twins (tests/support/edge_twins.py): `/v1/stats`
counts pending tasks once per interval for all callers, and listings past the rows budget are
answered 503 with Retry-After before any query. The API's own pool, its statement timeout and a
delivery beside slow reads need PostgreSQL and the engine, and stay on real servers
(tests/integration/api/test_read_isolation.py)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler.operations.stores import Listed, TaskFilter
from scheduler.store.memory_statistics import MemoryStatistics
from scheduler.store.memory_task_reads import MemoryTaskReads
from tests.integration.api.harness import TARGET, envelope, poll
from tests.support.edge_twins import READ, EdgeOnTwins, Reply, edge_on_twins

PENDING = {"status": "pending", "limit": 500}


def task_lists_begun(monkeypatch: pytest.MonkeyPatch) -> list[MemoryTaskReads]:
    """The stores of the task listings begun so far, each recorded before it reads."""
    begun: list[MemoryTaskReads] = []
    real = MemoryTaskReads.tasks

    async def recorded(
        self: MemoryTaskReads,
        where: TaskFilter,
        after: tuple[datetime, int, int] | None,
        limit: int,
    ) -> list[Listed]:
        begun.append(self)
        return await real(self, where, after, limit)

    monkeypatch.setattr(MemoryTaskReads, "tasks", recorded)
    return begun


async def list_pending(api: EdgeOnTwins) -> Reply:
    return await api.call("GET", "/v1/delayed", token=READ, params=PENDING)


async def test_stats_are_counted_once_for_a_crowd_and_stay_correct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty callers of /v1/stats within the interval (eight at once, the admission bound,
    then twelve in turn) share one count of pending tasks, no GROUP BY per request; a task
    stored later shows once the interval has passed."""
    counts: list[float] = []
    real = MemoryStatistics.pending_by_subject

    async def counted(self: MemoryStatistics, top: int) -> tuple[int, list[tuple[str, int]]]:
        counts.append(time.monotonic())
        return await real(self, top)

    monkeypatch.setattr(MemoryStatistics, "pending_by_subject", counted)
    async with edge_on_twins(tmp_path, forecast_interval=timedelta(seconds=3)) as api:
        due = datetime.now(UTC) + timedelta(hours=1)
        for _ in range(2):
            await api.store_task(TARGET, envelope(due))
        await poll(lambda: list_pending(api), lambda r: len(r.body["items"]) == 2)

        async def stats() -> dict[str, Any]:
            r = await api.call("GET", "/v1/stats", token=READ)
            assert r.status == 200, r
            return dict(r.body)

        crowd = await asyncio.gather(*(stats() for _ in range(8)))
        crowd += [await stats() for _ in range(12)]
        assert len(counts) == 1, f"{len(counts)} counts of pending tasks for 20 calls"
        assert {s["pending"] for s in crowd} == {2} and len({s["at"] for s in crowd}) == 1
        assert crowd[0]["pending_by_subject"] == [{"subject": TARGET, "pending": 2}]
        await api.store_task(TARGET, envelope(due))
        await poll(lambda: list_pending(api), lambda r: len(r.body["items"]) == 3)
        fresh = await poll(stats, lambda s: s["pending"] == 3, within=8)
        assert fresh["due"]["1h"] == 3 and fresh["at"] > crowd[0]["at"]
        assert len(counts) <= 3, f"{len(counts)} counts in a few seconds of polling"


async def test_listings_past_the_rows_budget_get_503_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SCHEDULER_API_READ_ROWS_PER_SECOND at 1000 (the bucket holds one page), of four
    500-task pages asked at once three are served, spaced at the rate (the last about a second
    after the first), and the fourth, which would wait longer, is answered 503 `overloaded`
    with Retry-After at once, before any query; requests without a token spend none of it."""
    async with edge_on_twins(tmp_path, api_read_rows_per_second=1000) as api:
        begun = task_lists_begun(monkeypatch)
        refused = [
            await api.call("GET", "/v1/delayed", token=None, params=PENDING) for _ in range(5)
        ]
        assert {r.status for r in refused} == {401}

        async def timed() -> tuple[Reply, float]:
            started = time.monotonic()
            reply = await list_pending(api)
            return reply, time.monotonic() - started

        answers = sorted(await asyncio.gather(*(timed() for _ in range(4))), key=lambda a: a[1])
        assert [reply.status for reply, _ in answers] == [503, 200, 200, 200], answers
        extra, took = answers[0]
        # "At once": it came back first of the four (above), before even the page served
        # without waiting, and ran no query (below). The wall-clock bound is the 1.5 s that
        # page would have waited for its rows (1,500 spent beyond the bucket's 500 at 1,000/s);
        # a busy host took 1.11 s to answer a refusal, so a tighter figure would time the host.
        assert took < 1.5, f"the refusal took {took:.2f}s"
        assert extra.body["code"] == "overloaded"
        assert "SCHEDULER_API_READ_ROWS_PER_SECOND" in extra.body["detail"]
        assert int(extra.headers["Retry-After"]) == 2
        assert len(begun) == 3, "the refused page ran its query anyway"
        waits = [round(took, 2) for _, took in answers[1:]]
        assert waits[1] >= 0.45 and waits[2] >= 0.95, f"served after {waits} s at 1000 rows/s"
