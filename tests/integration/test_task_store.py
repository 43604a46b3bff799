"""TaskStore against real PostgreSQL: statistics kept fresh after a burst of inserts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from scheduler.metrics import Metrics
from scheduler.store.postgres import PostgresStore, create_pool
from scheduler.store.tasks import NewTask, TaskStore


def batch(n: int, due: datetime) -> list[NewTask]:
    return [
        NewTask(f"t_{uuid.uuid4().hex}", "mq.tasks.x", b"{}", {}, 5, due, due, None)
        for _ in range(n)
    ]


async def test_analyze_runs_once_enough_rows_arrived(database_url: str) -> None:
    """A table filled by a burst is analyzed once (row estimate from 0 to the real count), not
    again until it has grown by half; a redelivered batch stored nothing and counts nothing."""
    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    due = datetime.now(UTC) + timedelta(hours=1)
    try:

        async def estimate() -> int:
            return int(
                await pool.fetchval(
                    "SELECT reltuples FROM pg_class WHERE oid = 'delayed_messages'::regclass"
                )
            )

        assert await tasks.analyze_if_stale(min_rows=100) is False  # nothing inserted yet
        first = batch(300, due)
        await tasks.insert(first)
        assert await tasks.insert(first) == []  # stored once, not counted twice
        assert tasks.inserted == 300
        assert await estimate() <= 0  # never analyzed: the planner thinks the table is empty
        assert await tasks.analyze_if_stale(min_rows=100) is True
        assert await estimate() == 300
        assert await tasks.analyze_if_stale(min_rows=100) is False  # nothing new since
        await tasks.insert(batch(120, due))  # grown by less than half of 300
        assert await tasks.analyze_if_stale(min_rows=100) is False
        await tasks.insert(batch(40, due))  # 160 new rows: more than half
        assert await tasks.analyze_if_stale(min_rows=100) is True
        assert await estimate() == 460
    finally:
        await pool.close()


async def test_mark_fired_records_exact_instants_whatever_the_ids(database_url: str) -> None:
    """Booking passes ids, subjects and streams joined into one string and instants as integer
    microseconds; an id the separator cannot carry (or an empty one) takes plain arrays. Both
    record status, stream sequence and the fire log to the microsecond."""
    from scheduler.store.leadership import take_office
    from scheduler.store.tasks import Fired

    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    try:
        epoch = await take_office(pool, "t")
        due = datetime(2026, 11, 24, 3, 0, 0, 123457, tzinfo=UTC)  # odd microseconds
        plain = batch(3, due)
        odd = batch(2, due)
        odd[0].id = "odd\x1fid"
        expires = due + timedelta(hours=1, microseconds=3)
        plain[1].expires_at = odd[1].expires_at = expires
        for group in (plain, odd):
            await tasks.insert(group)
            claimed = await tasks.claim(epoch, [t.id for t in group], due)
            assert len(claimed) == len(group)
            assert [t.expires_at for t in claimed] == [t.expires_at for t in group]
            fired_at = due + timedelta(microseconds=999)
            await tasks.mark_fired(
                epoch,
                [Fired(t, fired_at, "TASKS", 40 + i) for i, t in enumerate(claimed)],
                "t",
            )
        assert await pool.fetchval("SELECT count(*) FROM delayed_messages") == 0  # deleted
        rows = await pool.fetch(
            "SELECT d.id, 'fired' AS status, f.stream_seq, d.fired_at, f.key, f.subject, "
            "f.stream, f.scheduled_for, f.fired_at AS logged_at FROM fired_tasks d "
            "JOIN fire_log f ON f.key = d.id"
        )
        assert {r["id"] for r in rows} == {t.id for t in plain + odd}
        for r in rows:
            assert r["status"] == "fired" and r["key"] == r["id"]
            assert r["subject"] == "mq.tasks.x" and r["stream"] == "TASKS"
            assert r["scheduled_for"] == due
            assert r["fired_at"] == r["logged_at"] == due + timedelta(microseconds=999)
            assert r["stream_seq"] >= 40
    finally:
        await pool.close()


async def test_a_resend_inserted_while_its_task_is_booked_fired_is_refused(
    database_url: str,
) -> None:
    """A resend of a task whose `mark_fired` commits while the insert runs (the insert waits on
    the deleted row, then finds no conflict) is still refused: the tombstone check after the
    insert takes a new snapshot, so the id is neither stored nor claimable, and is `resent`."""
    import asyncio

    import asyncpg

    from scheduler.store.leadership import take_office
    from scheduler.store.tasks import Fired

    pool = await create_pool(database_url, min_size=1, max_size=4)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    blocker = await asyncpg.connect(database_url)
    try:
        epoch = await take_office(pool, "t")
        due = datetime.now(UTC) - timedelta(seconds=1)
        (task,) = batch(1, due)
        await tasks.insert([task])
        (claimed,) = await tasks.claim(epoch, [task.id], due)

        async def waiting() -> int:  # not on `blocker`: its transaction caches the view
            return int(
                await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            )

        async def until_waiting(n: int) -> None:
            async with asyncio.timeout(5):
                while await waiting() < n:  # noqa: ASYNC110 (a server's state, no event)
                    await asyncio.sleep(0.02)

        # An uncommitted tombstone holds mark_fired after its DELETE, before its commit.
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute(
            "INSERT INTO fired_tasks VALUES ($1, 'x', md5('')::uuid, now())", task.id
        )
        booking = asyncio.create_task(
            tasks.mark_fired(epoch, [Fired(claimed, datetime.now(UTC), "S", 1)], "t")
        )
        await until_waiting(1)
        resend = asyncio.create_task(tasks.insert_batch([task]))  # waits on the deleted row
        await until_waiting(2)
        await lock.rollback()
        await booking
        got = await resend
        assert (got.stored, got.resent, got.taken) == ([], [task], [])
        assert await pool.fetchval("SELECT count(*) FROM delayed_messages") == 0
        assert await pool.fetchval("SELECT target FROM fired_tasks") == "mq.tasks.x"
    finally:
        await blocker.close()
        await pool.close()
