"""PostgreSQL's clock as the operator half asks it (`scheduler.operations.stores.DatabaseTime`),
over the in-memory twin and PostgreSQL alike: one question answered with this host's time
before it, the database's time, and this host's time after it."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.operations.stores import DatabaseTime
from scheduler.store.memory_clock import MemoryDatabaseTime


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
async def ask(database: str | None) -> AsyncIterator[DatabaseTime]:
    if database is None:
        yield MemoryDatabaseTime(_now)
        return
    from scheduler.store.postgres.connect import create_pool
    from scheduler.store.postgres.epoch import database_time

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        yield functools.partial(database_time, pool, _now)
    finally:
        await pool.close()


async def test_the_databases_time_comes_between_the_question_and_the_answer(
    ask: DatabaseTime,
) -> None:
    """Each answer is three aware UTC instants in order: this host's clock when asked, the
    database's (on this host's clock), this host's when answered, moments apart; a later
    question is answered later."""
    before = _now()
    sent, theirs, back = await ask()
    assert before <= sent <= theirs <= back <= _now()
    assert all(t.utcoffset() == timedelta(0) for t in (sent, theirs, back))
    assert back - sent < timedelta(seconds=2)
    again = await ask()
    assert again[0] >= back and again[1] >= theirs
