"""`scheduler partitions set`: a deployment moved to another partition count on a real
PostgreSQL (scheduler/store/postgres/repartition.py), the liveness check on a real NATS
(scheduler/leadership/liveness.py) and the command itself as a process."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import asyncpg
import nats
import pytest

from scheduler.errors import ConfigError, EnginesRunningError, FencedError
from scheduler.leadership.liveness import engine_signs
from scheduler.metrics import Metrics
from scheduler.partitions import partition_of
from scheduler.records import Advance, NewTask
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.epoch import take_office
from scheduler.store.postgres.partitioning import check_partitions
from scheduler.store.postgres.repartition import Repartition, repartition
from scheduler.store.postgres.tasks import TaskStore
from tests.support.helpers import waiting_on_locks
from tests.support.processes import cli_env, scheduler
from tests.support.stores import claim, insert

# Ids of varied UTF-8: ULID-like, accents (composed and combining), CJK, right-to-left,
# emoji (one with a zero-width joiner), symbols, spaces, and 1-, 2-, 3- and 4-byte letters
IDS = [f"01JF3Z8Q6W5N4XKJ7Y2V{i:06d}" for i in range(120)] + [
    "é€😀",
    "café",
    "cafe\u0301",
    "任务-42",
    "مهمة/\u0667",
    "👩\u200d💻 deploy",
    "Ωmega ∑ ≠ ∞",
    "ÅÄÖ åäö",
    "a b\tc",
    "ŉ",
    "ᚠᛇᚻ",
    "\U0001d518\U0001d52b\U0001d526",  # Fraktur letters (4 bytes each)
]
JOBS = ["credit-reconciliation", "nightly-ü-report", "同步-hourly", "a", "z-" + "x" * 60]
INTENT = "intent-ñ-on-the-lane"
MOVES = [(1, 8), (8, 64), (64, 1)]
OPERATIONS = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


def task(task_id: str, due: datetime) -> NewTask:
    return NewTask(task_id, "mq.tasks.x", b"{}", {}, 5, due, due, None)


async def seeded(pool: asyncpg.Pool, count: int) -> int:
    """A deployment at `count` partitions (chosen by its first engine) storing IDS as tasks,
    JOBS as cron jobs and an intent, each where `partition_of` puts it, whose offices a few
    terms have raised to uneven epochs; the highest epoch."""
    await check_partitions(pool, count)
    tasks = TaskStore(PostgresStore(pool, Metrics()), partitions=count)
    await insert(tasks, [task(i, datetime.now(UTC) + timedelta(hours=1)) for i in IDS])
    await pool.executemany(
        "INSERT INTO schedules (name, definition, fingerprint, partition) "
        "VALUES ($1, '{}', 'f', $2)",
        [(job, partition_of(job, count)) for job in JOBS],
    )
    await pool.execute(
        "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, status, "
        "intent) VALUES ($1, 'mq.tasks.x', ''::bytea, now(), now(), 'intent', 'cancel')",
        INTENT,
    )
    top = await take_office(pool, "old-a", partitions=range(count))
    if count > 1:
        top = await take_office(pool, "old-b", partitions=range(count // 2))
    return top


async def partitions_of(pool: asyncpg.Pool) -> dict[str, dict[str, int]]:
    tasks = await pool.fetch("SELECT id, partition FROM delayed_messages")
    jobs = await pool.fetch("SELECT name, partition FROM schedules")
    return {
        "tasks": {r["id"]: r["partition"] for r in tasks},
        "jobs": {r["name"]: r["partition"] for r in jobs},
    }


async def offices(pool: asyncpg.Pool) -> list[tuple[int, int]]:
    rows = await pool.fetch("SELECT partition, epoch FROM partition_offices ORDER BY partition")
    return [(r["partition"], r["epoch"]) for r in rows]


async def recorded(pool: asyncpg.Pool) -> tuple[int, datetime]:
    row = await pool.fetchrow("SELECT partitions, chosen_at FROM partitioning WHERE id = 1")
    assert row is not None
    return row["partitions"], row["chosen_at"]


async def move(pool: asyncpg.Pool, count: int, **options: Any) -> Repartition:
    async with pool.acquire() as proxy:  # the pool's connection, as the command's own
        conn = cast(asyncpg.Connection, proxy)
        return await repartition(conn, count, options.pop("alive", None), **options)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    opened = await create_pool(database_url, min_size=1, max_size=3)
    yield opened
    await opened.close()


@pytest.mark.parametrize(("was", "count"), MOVES)
async def test_every_row_lands_where_partition_of_puts_it(
    pool: asyncpg.Pool, was: int, count: int
) -> None:
    """Each task (ids of varied UTF-8) and cron job moves to `partition_of(key, count)`, an
    intent stays in partition 0 as the API writes it, the counts moved are the rows whose
    partition changed, and the count is recorded: an engine at the new count starts, one at
    the old count is refused (with the line the operations guide quotes)."""
    await seeded(pool, was)
    before = await partitions_of(pool)
    _, chosen_before = await recorded(pool)
    result = await move(pool, count)
    after = await partitions_of(pool)
    want = {i: partition_of(i, count) for i in IDS} | {INTENT: 0}
    assert after["tasks"] == want
    assert after["jobs"] == {job: partition_of(job, count) for job in JOBS}
    changed = {
        kind: sum(after[kind][k] != before[kind][k] for k in before[kind]) for kind in before
    }
    assert [(t.table, t.moved, t.rows) for t in result.tables] == [
        ("delayed_messages", changed["tasks"], len(IDS) + 1),
        ("schedules", changed["jobs"], len(JOBS)),
    ]
    assert result.written and (result.was, result.count) == (was, count)
    assert changed["tasks"] > 0  # the seed moves something under every pair
    partitions, chosen = await recorded(pool)
    assert partitions == count and chosen > chosen_before
    await check_partitions(pool, count)
    with pytest.raises(ConfigError) as refused:
        await check_partitions(pool, was)
    if (was, count) == (64, 1):  # the line docs/operations.md quotes, word for word
        assert f"`scheduler: configuration error: {refused.value}`" in OPERATIONS


@pytest.mark.parametrize(("was", "count"), MOVES)
async def test_the_new_offices_are_exactly_the_count_each_above_every_old_epoch(
    pool: asyncpg.Pool, was: int, count: int
) -> None:
    """After the move there are exactly `count` office rows, each at one epoch above the
    highest any old row had (the leadership view shows partition 0's), and the next take of
    office goes above that."""
    top = await seeded(pool, was)
    old = await offices(pool)
    assert max(epoch for _, epoch in old) == top and len({e for _, e in old}) == min(was, 2)
    result = await move(pool, count)
    assert (result.top, result.epoch, result.offices_was) == (top, top + 1, was)
    assert await offices(pool) == [(p, top + 1) for p in range(count)]
    row = await pool.fetchrow("SELECT id, epoch, instance FROM leadership")
    assert row is not None and tuple(row) == (1, top + 1, None)
    assert await take_office(pool, "new", partitions=range(count)) == top + 2


@pytest.mark.parametrize(("was", "count", "office"), [(1, 8, [0]), (8, 64, [1, 5]), (64, 1, [9])])
async def test_an_engine_of_the_old_layout_is_fenced_on_every_write(
    pool: asyncpg.Pool, was: int, count: int, office: list[int]
) -> None:
    """A term of the old layout, taken just before the move, claims no task, expires none and
    moves no cron cursor afterwards: each write raises FencedError and the rows are as they
    were (the fence by epoch, whatever partition the rows moved to)."""
    await seeded(pool, was)
    db = PostgresStore(pool, Metrics())
    tasks, jobs = TaskStore(db, partitions=was), ScheduleStore(db, partitions=was)
    tasks.office = jobs.office = office
    job = next(f"job-{n}" for n in itertools.count() if partition_of(f"job-{n}", was) in office)
    await pool.execute(
        "INSERT INTO schedules (name, definition, fingerprint, partition) "
        "VALUES ($1, '{}', 'f', $2)",
        job,
        partition_of(job, was),
    )
    epoch = await take_office(pool, "old-term", partitions=office)
    mine = [i for i in IDS if partition_of(i, was) in office][:5]
    assert mine
    await move(pool, count)
    until = datetime.now(UTC) + timedelta(hours=2)
    with pytest.raises(FencedError):
        await claim(tasks, epoch, mine, until)
    with pytest.raises(FencedError):
        await tasks.expire(epoch, mine)
    at = datetime(2026, 12, 6, 12, tzinfo=UTC)
    with pytest.raises(FencedError):
        await jobs.advance(epoch, [Advance(job, "mq.x", at, at, "S", 1)], "old-term")
    assert await jobs.cursors() == {}
    rows = await pool.fetch(
        "SELECT status, claimed_epoch FROM delayed_messages WHERE id = ANY($1)", mine
    )
    assert [tuple(r) for r in rows] == [("pending", None)] * len(mine)


@pytest.mark.parametrize(("was", "count", "office"), [(1, 8, [0]), (8, 64, [1, 2])])
async def test_an_engine_of_the_old_count_takes_office_no_more(
    pool: asyncpg.Pool, was: int, count: int, office: list[int]
) -> None:
    """After the move a take of office by an engine of the old count (as both offices take
    it, with their count) raises ConfigError naming both counts and raises no epoch; one of
    the new count takes office above the move's epoch."""
    await seeded(pool, was)
    result = await move(pool, count)
    with pytest.raises(ConfigError) as caught:
        await take_office(pool, "old", partitions=office, count=was)
    assert f"is {was}, but" in str(caught.value) and f"changed to {count}" in str(caught.value)
    assert await offices(pool) == [(p, result.epoch) for p in range(count)]
    assert await take_office(pool, "new", partitions=office, count=count) == result.epoch + 1


async def test_a_take_of_office_waiting_on_the_move_is_refused_after_it(
    pool: asyncpg.Pool,
) -> None:
    """A take of office by an engine of the old count that starts while the move holds the
    count waits for it, then finds the new count and takes nothing."""
    await seeded(pool, 8)
    locked, gate = asyncio.Event(), asyncio.Event()

    async def alive() -> str | None:
        locked.set()
        await gate.wait()
        return None

    moving = asyncio.create_task(move(pool, 64, alive=alive))
    try:
        async with asyncio.timeout(5):
            await locked.wait()
        taking = asyncio.create_task(take_office(pool, "old", partitions=[3], count=8))
        await waiting_on_locks(pool, 1)
    finally:
        gate.set()
        async with asyncio.timeout(10):
            result = await moving
    with pytest.raises(ConfigError):
        await taking
    assert await offices(pool) == [(p, result.epoch) for p in range(64)]


async def test_a_dry_run_writes_nothing_and_says_what_would_move(pool: asyncpg.Pool) -> None:
    """`--dry-run` counts the rows that would move (as many as a real run then moves) and
    leaves every row, office and the recorded count as they were."""
    await seeded(pool, 8)
    state = (await partitions_of(pool), await offices(pool), await recorded(pool))
    dry = await move(pool, 64, dry_run=True)
    assert (await partitions_of(pool), await offices(pool), await recorded(pool)) == state
    assert dry.needed and not dry.written
    real = await move(pool, 64)
    assert [(t.table, t.moved) for t in dry.tables] == [(t.table, t.moved) for t in real.tables]
    assert dry.moved > 0 and dry.epoch == real.epoch


async def test_a_dry_run_reports_running_engines_and_waits_on_no_lock(
    pool: asyncpg.Pool,
) -> None:
    """While an engine looks alive a dry run still answers (to plan before stopping them),
    naming the signs, and takes no lock: a term's take of office during it goes through."""
    await seeded(pool, 8)
    state = (await partitions_of(pool), await offices(pool), await recorded(pool))
    taken: list[int] = []

    async def alive() -> str | None:
        async with asyncio.timeout(5):  # would wait for ever on a lock held by the dry run
            taken.append(await take_office(pool, "running", partitions=range(8)))
        return "lease keys of partitions 0-7 held"

    dry = await move(pool, 64, dry_run=True, alive=alive)
    assert dry.engines == "lease keys of partitions 0-7 held" and dry.moved > 0
    rows, _, count = state
    assert await partitions_of(pool) == rows and await recorded(pool) == count
    assert await offices(pool) == [(p, taken[0]) for p in range(8)]


async def test_a_second_run_with_the_same_count_changes_nothing(pool: asyncpg.Pool) -> None:
    """Run twice with 8: the second moves no row and writes no epoch nor count (the intent
    in partition 0 is in place)."""
    await seeded(pool, 1)
    await move(pool, 8)
    state = (await partitions_of(pool), await offices(pool), await recorded(pool))
    again = await move(pool, 8)
    assert not again.needed and again.moved == 0 and not again.written
    assert (await partitions_of(pool), await offices(pool), await recorded(pool)) == state


async def test_signs_of_a_running_engine_refuse_the_move_before_and_after(
    pool: asyncpg.Pool,
) -> None:
    """A sign of a running engine when the command starts, or only when it is about to
    commit (an engine started meanwhile), refuses the move with nothing written; no sign,
    and it goes through."""
    await seeded(pool, 8)
    state = (await partitions_of(pool), await offices(pool), await recorded(pool))
    answers: list[str | None] = []

    async def alive() -> str | None:
        return answers.pop(0)

    for script in (["lease keys of partitions 0-7 held"], [None, "heartbeats of e1"]):
        answers[:] = script
        with pytest.raises(EnginesRunningError) as caught:
            await move(pool, 64, alive=alive)
        assert caught.value.signs == script[-1] and answers == []
        assert (await partitions_of(pool), await offices(pool), await recorded(pool)) == state
    answers[:] = [None, None]
    assert (await move(pool, 64, alive=alive)).written and answers == []


async def test_an_engine_starting_during_the_move_reads_the_new_count(
    pool: asyncpg.Pool,
) -> None:
    """An engine's check of the count that starts while the move's transaction holds the
    count waits for it and then refuses the old count (a plain read would have let it start
    under the old layout)."""
    await seeded(pool, 1)
    locked, gate = asyncio.Event(), asyncio.Event()

    async def alive() -> str | None:
        locked.set()  # asked first once the count and the offices are locked
        await gate.wait()
        return None

    moving = asyncio.create_task(move(pool, 8, alive=alive))
    try:
        async with asyncio.timeout(5):
            await locked.wait()
        checking = asyncio.create_task(check_partitions(pool, 1))
        await waiting_on_locks(pool, 1)
    finally:  # the move ends whatever happened, so its connection goes back to the pool
        gate.set()
        async with asyncio.timeout(10):
            await moving
    with pytest.raises(ConfigError) as caught:
        await checking
    assert "partition count of 8" in str(caught.value)


async def test_the_buckets_say_when_an_engine_looks_alive(nats_url: str) -> None:
    """On a real NATS: a lease key (`leader`, or a partition's) or a fresh heartbeat is a
    sign; a heartbeat older than its stale bound, a deleted key or no bucket at all is none."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        assert await engine_signs(None, None, datetime.now(UTC)) is None
        leader = await js.create_key_value(bucket="scheduler_leader", ttl=30)
        state = await js.create_key_value(bucket="scheduler_state")
        now = datetime.now(UTC)
        assert await engine_signs(leader, state, now) is None
        await leader.put("p.3", b'{"instance": "e1", "epoch": 4}')
        await leader.put("p.4", b"{}")
        assert await engine_signs(leader, state, now) == "lease keys of partitions 3-4 held"
        await leader.delete("p.3")
        await leader.delete("p.4")
        await leader.put("leader", b"{}")
        assert await engine_signs(leader, state, now) == "lease key leader held"
        await leader.delete("leader")
        stale = {"instance": "gone", "role": "standby", "at": _ago(now, 20)}
        await state.put("instances.gone", json.dumps(stale).encode())
        assert await engine_signs(leader, state, now) is None
        fresh = {"instance": "e2", "role": "leader", "at": _ago(now, 1)}
        await state.put("instances.e2", json.dumps(fresh).encode())
        assert await engine_signs(leader, state, now) == "heartbeats of e2 within 15 s"
    finally:
        await nc.close()


def _ago(now: datetime, seconds: float) -> str:
    return (now - timedelta(seconds=seconds)).isoformat()


async def test_the_command_refuses_while_a_lease_is_held_and_moves_once_it_is_gone(
    tmp_path: Path, nats_url: str, database_url: str, pool: asyncpg.Pool
) -> None:
    """`scheduler partitions set --count 8` with a lease key in the leader bucket: exit 2,
    one line naming the key, nothing moved; with the key gone: exit 0, a line per table and
    one for the offices, every row moved."""
    await seeded(pool, 1)
    nc = await nats.connect(nats_url)
    try:
        leader = await nc.jetstream().create_key_value(bucket="scheduler_leader", ttl=30)
        await leader.put("leader", b'{"instance": "e1"}')
        env = cli_env(tmp_path, SCHEDULER_NATS_URL=nats_url, SCHEDULER_DATABASE_URL=database_url)
        refused = await _run(["partitions", "set", "--count", "8"], env)
        assert refused[0] == 2, refused
        assert refused[2] == [
            "scheduler: partitions set: refused, engines look alive (lease key leader held): "
            "stop every engine first (or, for a cluster known to be down, --force)"
        ]
        assert (await recorded(pool))[0] == 1
        await leader.delete("leader")
        code, out, err = await _run(["partitions", "set", "--count", "8"], env)
    finally:
        await nc.close()
    assert code == 0, (out, err)
    assert out[0].startswith(f"delayed_messages: {_moved(IDS, 8)} of {len(IDS) + 1} rows moved")
    assert out[1].startswith(f"schedules: {_moved(JOBS, 8)} of {len(JOBS)} rows moved")
    assert out[2].startswith("partition_offices: 1 -> 8 rows, each at epoch ")
    assert out[3].startswith("partition count 1 -> 8 in ")
    assert out[3].endswith("start the engines with SCHEDULER_PARTITIONS=8")
    assert (await recorded(pool))[0] == 8


def _moved(keys: Sequence[str], count: int) -> int:
    return sum(partition_of(k, count) != 0 for k in keys)


async def _run(args: list[str], env: dict[str, str]) -> tuple[int, list[str], list[str]]:
    with scheduler(args, env) as proc:
        code = await asyncio.to_thread(proc.wait_exit, 60)
        return code, list(proc.out), list(proc.err)
