"""Schema migrations against real PostgreSQL: idempotent up, clean down, fire-log partitions."""

from __future__ import annotations

import asyncio
import os
import re
import runpy
import sys
from asyncio.subprocess import PIPE
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from alembic.script import ScriptDirectory

from scheduler.daemon import migrate
from scheduler.metrics import Metrics
from scheduler.store.postgres.connect import PostgresStore, create_pool
from tests.support.stores import claim

TABLES = {"delayed_messages", "fire_log", "dead_letters", "alembic_version"}


async def tables(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
        )
    finally:
        await conn.close()
    return {r["relname"] for r in rows}


async def test_upgrade_twice_is_idempotent(database_url: str) -> None:
    """Running the migrations again on an up-to-date database changes nothing and succeeds."""
    before = await tables(database_url)
    await migrate.upgrade_async(database_url)
    await migrate.upgrade_async(database_url)
    assert await tables(database_url) == before
    assert before >= TABLES


async def test_downgrade_to_base_and_up_again(database_url: str) -> None:
    """Down-migrations remove every table and function; upgrading again restores them."""
    await asyncio.to_thread(migrate.downgrade, database_url, "base")
    assert await tables(database_url) <= {"alembic_version"}
    conn = await asyncpg.connect(database_url)
    try:
        fn = await conn.fetchval("SELECT to_regproc('scheduler_fire_log_upkeep')")
    finally:
        await conn.close()
    assert fn is None
    await migrate.upgrade_async(database_url)
    assert await tables(database_url) >= TABLES


READY_INDEXES = (
    "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN "
    "('delayed_messages_pending_due', 'delayed_messages_in_doubt_due') ORDER BY indexname"
)


async def test_pending_partial_index_exists(database_url: str) -> None:
    """`delayed_messages` has a partial index on pending due times, by partition first
    (migration 0024); downgrading to 0023 puts back the index of due times alone, and
    upgrading again the one by partition, for in-doubt tasks as well."""
    conn = await asyncpg.connect(database_url)
    try:
        for revision, columns in (
            (None, "(partition, due_at, priority, seq)"),
            ("0023", "(due_at, priority, seq)"),
            ("head", "(partition, due_at, priority, seq)"),
        ):
            if revision == "0023":
                await asyncio.to_thread(migrate.downgrade, database_url, revision)
            elif revision == "head":
                await migrate.upgrade_async(database_url)
            rows = await conn.fetch(READY_INDEXES)
            assert [r["indexname"] for r in rows] == [
                "delayed_messages_in_doubt_due",
                "delayed_messages_pending_due",
            ]
            for row, status in zip(rows, ("in_doubt", "pending"), strict=True):
                assert f"USING btree {columns} WHERE (status = '{status}'::text)" in row[1]
    finally:
        await conn.close()


async def test_fire_log_upkeep_creates_ahead_moves_default_rows_and_drops_old(
    database_url: str,
) -> None:
    """Upkeep creates partitions two days ahead, moves stray default rows, drops expired days."""
    pool = await create_pool(database_url, min_size=1, max_size=2)
    store = PostgresStore(pool, Metrics())
    try:
        async with pool.acquire() as conn:
            far = datetime.now(UTC) + timedelta(days=5)
            await conn.execute(
                "INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, attempt, "
                "epoch, instance) VALUES ('cron', 'job', 'mq.x', $1, $1, 1, 1, 'i')",
                far,
            )
            assert await conn.fetchval("SELECT count(*) FROM fire_log_default") == 1
            await conn.execute(
                "CREATE TABLE fire_log_p20200101 PARTITION OF fire_log "
                "FOR VALUES FROM ('2020-01-01') TO ('2020-01-02')"
            )
            changes = await store.fire_log_upkeep(retention_days=14, ahead_days=5)
            assert "dropped fire_log_p20200101" in changes
            day = far.strftime("%Y%m%d")
            assert f"created fire_log_p{day}" in changes
            assert await conn.fetchval("SELECT count(*) FROM fire_log_default") == 0
            where = await conn.fetchval("SELECT tableoid::regclass::text FROM fire_log")
            assert where == f"fire_log_p{day}"
            assert await store.fire_log_upkeep(retention_days=14, ahead_days=5) == []
            head = ScriptDirectory.from_config(migrate.alembic_config(database_url))
            revision = await conn.fetchval("SELECT version_num FROM alembic_version")
            assert revision == head.get_current_head()
    finally:
        await store.close()


async def test_purge_deletes_only_old_finished_tasks(database_url: str) -> None:
    """The upkeep purge removes fired/cancelled/expired tasks past the retention, nothing else."""
    from scheduler.store.postgres.tasks import TaskStore

    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    try:
        old = datetime.now(UTC) - timedelta(days=20)
        for i, status in enumerate(["fired", "cancelled", "expired", "dead", "pending", "fired"]):
            stamp = old if i < 5 else datetime.now(UTC)
            await pool.execute(
                "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, "
                "status, updated_at) VALUES ($1, 'mq.x', '{}', $2, $2, $3, $2)",
                f"t{i}",
                stamp,
                status,
            )
        for name, stamp in (("gone", old), ("kept", datetime.now(UTC))):
            await pool.execute(
                "INSERT INTO fired_tasks (id, target, digest, fired_at) "
                "VALUES ($1, 'mq.x', md5('{}')::uuid, $2)",
                name,
                stamp,
            )
        assert await tasks.purge_finished(14) == 3 + 1
        left = {r["id"] for r in await pool.fetch("SELECT id FROM delayed_messages")}
        assert left == {"t3", "t4", "t5"}
        assert [r["id"] for r in await pool.fetch("SELECT id FROM fired_tasks")] == ["kept"]
    finally:
        await pool.close()


async def test_migration_0010_turns_fired_rows_into_tombstones_and_back(
    database_url: str,
) -> None:
    """Upgrading to 0010 deletes fired rows of `delayed_messages`, each leaving a tombstone in
    `fired_tasks` (target, digest of the bytes, fired_at); other rows stay. Downgrading to
    0009 drops the tombstones' table; upgrading again creates it."""
    await asyncio.to_thread(migrate.downgrade, database_url, "0009")
    assert "fired_tasks" not in await tables(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        fired_at = datetime(2026, 11, 24, 3, 0, 0, 5, tzinfo=UTC)
        for name, status in (("f", "fired"), ("p", "pending")):
            await conn.execute(
                "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, "
                "status, fired_at) VALUES ($1, 'mq.x', '{\"a\":1}', $2, $2, $3, $2)",
                name,
                fired_at,
                status,
            )
        await migrate.upgrade_async(database_url)
        rows = await conn.fetch("SELECT id FROM delayed_messages")
        assert [r["id"] for r in rows] == ["p"]
        tomb = await conn.fetchrow(
            "SELECT id, target, digest = md5('{\"a\":1}'::bytea)::uuid AS same, fired_at "
            "FROM fired_tasks"
        )
        assert tomb is not None
        assert dict(tomb) == {"id": "f", "target": "mq.x", "same": True, "fired_at": fired_at}
    finally:
        await conn.close()
    await asyncio.to_thread(migrate.downgrade, database_url, "0009")
    assert "fired_tasks" not in await tables(database_url)
    await migrate.upgrade_async(database_url)
    assert "fired_tasks" in await tables(database_url)


OLD_INTAKE = (
    "SELECT id FROM scheduler_intake_insert($1::text[], ARRAY['mq.x'], ARRAY['{}'::bytea], "
    "ARRAY['{}'::jsonb], ARRAY[5::smallint], ARRAY[$2::bigint], ARRAY[$2::bigint], NULL, NULL)"
)
NEW_INTAKE = OLD_INTAKE.replace("NULL, NULL)", "NULL, NULL, $3::smallint[])")
PARTITION_OF = "SELECT partition FROM {} WHERE {} = $1"
HAS_COLUMN = (
    "SELECT count(*) FROM information_schema.columns WHERE column_name = 'partition' "
    "AND table_name IN ('delayed_messages', 'schedules')"
)


async def test_migration_0022_puts_every_row_in_partition_0_and_back(database_url: str) -> None:
    """Upgrading to 0022 leaves every task and cron job in partition 0 and records the count 1;
    the previous version's intake (nine arguments) still stores tasks, in partition 0, beside
    the new one, which stores the partitions it is given. Downgrading to 0021 drops the
    columns, the table, the index and the new function; intake the old way still works."""
    await asyncio.to_thread(migrate.downgrade, database_url, "0021")
    due = int(datetime.now(UTC).timestamp() * 1e6) + 60_000_000
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval(OLD_INTAKE, ["before"], due) == "before"
        await conn.execute(
            "INSERT INTO schedules (name, definition, fingerprint) VALUES ('job', '{}', 'f')"
        )
        await migrate.upgrade_async(database_url)
        assert await conn.fetchval("SELECT partitions FROM partitioning") == 1
        assert await conn.fetchval(PARTITION_OF.format("schedules", "name"), "job") == 0
        assert await conn.fetchval(OLD_INTAKE, ["rolling"], due) == "rolling"
        assert await conn.fetchval(NEW_INTAKE, ["new"], due, [7]) == "new"
        stored = await conn.fetch("SELECT id, partition FROM delayed_messages ORDER BY seq")
        assert [tuple(r) for r in stored] == [("before", 0), ("rolling", 0), ("new", 7)]
        await asyncio.to_thread(migrate.downgrade, database_url, "0021")
        assert await conn.fetchval(HAS_COLUMN) == 0
        assert "partitioning" not in await tables(database_url)
        gone = "SELECT count(*) = 1 FROM pg_proc WHERE proname = 'scheduler_intake_insert'"
        assert await conn.fetchval(gone)
        assert await conn.fetchval(OLD_INTAKE, ["after"], due) == "after"
    finally:
        await conn.close()
    await migrate.upgrade_async(database_url)
    assert "partitioning" in await tables(database_url)


# the previous version's take_office and fence (0002-0022), as it runs while a Deployment rolls
OLD_TAKE_OFFICE = (
    "UPDATE leadership AS l SET epoch = greatest(l.epoch, $2) + 1, instance = $1, "
    "since = now() FROM (SELECT epoch FROM leadership WHERE id = 1) AS was "
    "WHERE l.id = 1 RETURNING l.epoch"
)
OLD_FENCE = (
    "WITH lead AS (SELECT epoch FROM leadership WHERE id = 1 AND epoch = $1 FOR SHARE) "
    "SELECT count(*) FROM lead"
)
OFFICES = "SELECT partition, epoch, instance FROM partition_offices ORDER BY partition"


async def test_migration_0023_gives_every_partition_the_leader_s_epoch_and_back(
    database_url: str,
) -> None:
    """Upgrading to 0023 gives each partition of the recorded count an office with the
    leadership row's epoch and instance, and leaves `leadership` as partition 0's office, where
    the previous version still takes office and fences. Downgrading to 0022 puts the table back
    with the highest epoch of any partition; upgrading again restores the offices."""
    await asyncio.to_thread(migrate.downgrade, database_url, "0022")
    assert "partition_offices" not in await tables(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("UPDATE leadership SET epoch = 7, instance = 'old', since = now()")
        await conn.execute("UPDATE partitioning SET partitions = 3")
        await migrate.upgrade_async(database_url)
        assert [tuple(r) for r in await conn.fetch(OFFICES)] == [(p, 7, "old") for p in range(3)]
        assert "leadership" not in await tables(database_url)  # a view now
        assert await conn.fetchval(OLD_TAKE_OFFICE, "previous", 0) == 8
        assert await conn.fetchval(OLD_FENCE, 8) == 1 and await conn.fetchval(OLD_FENCE, 7) == 0
        assert tuple(await conn.fetchrow(OFFICES) or ()) == (0, 8, "previous")
        await conn.execute("UPDATE partition_offices SET epoch = 12 WHERE partition = 2")
        await asyncio.to_thread(migrate.downgrade, database_url, "0022")
        assert "partition_offices" not in await tables(database_url)
        row = await conn.fetchrow("SELECT id, epoch, instance FROM leadership")
        assert row is not None and tuple(row) == (1, 12, "previous")
        await conn.execute("UPDATE partitioning SET partitions = 1")
    finally:
        await conn.close()
    await migrate.upgrade_async(database_url)
    assert "partition_offices" in await tables(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        assert [tuple(r) for r in await conn.fetch(OFFICES)] == [(0, 12, "previous")]
    finally:
        await conn.close()


FIRE_LOG_INDEXES = (
    "SELECT c.relname, i.indisprimary FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE i.indrelid = 'fire_log'::regclass ORDER BY c.relname"
)


async def test_migration_0011_drops_the_fire_log_primary_key_and_back(database_url: str) -> None:
    """0011 drops `fire_log`'s primary key (no query reads a row by id) and keeps the two
    indexes the queries use; rows still go in, on every partition. Downgrading to 0010 adds the
    key again over the rows written meanwhile."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(FIRE_LOG_INDEXES)
        assert [(r["relname"], r["indisprimary"]) for r in rows] == [
            ("fire_log_fired_at", False),
            ("fire_log_once", False),
        ]
        now = datetime.now(UTC)
        for at in (now, datetime(2020, 1, 1, tzinfo=UTC)):  # today's partition and the default
            await conn.execute(
                "INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, attempt, "
                "epoch, instance) VALUES ('delayed', 'mig-0011', 'mq.x', $1, $1, 1, 1, 'i')",
                at,
            )
        await asyncio.to_thread(migrate.downgrade, database_url, "0010")
        rows = await conn.fetch(FIRE_LOG_INDEXES)
        assert ("fire_log_pkey", True) in [(r["relname"], r["indisprimary"]) for r in rows]
        assert await conn.fetchval("SELECT count(*) FROM fire_log WHERE key = 'mig-0011'") == 2
        await migrate.upgrade_async(database_url)
        rows = await conn.fetch(FIRE_LOG_INDEXES)
        assert "fire_log_pkey" not in [r["relname"] for r in rows]
    finally:
        await conn.close()


async def test_migration_0013_keeps_claims_and_gives_the_table_room_for_hot_claims(
    database_url: str,
) -> None:
    """At 0012 a claimed row has the status `claimed`, and a task put back by a retry keeps
    its old `claimed_epoch`. Upgrading to 0013 sets fillfactor 45, clears that stale epoch (the
    task is pending again, not claimed) and leaves the claimed rows as they are (the previous
    version may still run): they read `claimed` (`in_flight` once in doubt) and the next
    leader takes them over, back to their ready status and claimed by its epoch. Downgrading
    to 0012 turns tasks claimed the new way into `claimed` rows again."""
    from scheduler.records import Fired
    from scheduler.store.postgres.epoch import take_office
    from scheduler.store.postgres.tasks import TaskStore

    await asyncio.to_thread(migrate.downgrade, database_url, "0012")
    conn = await asyncpg.connect(database_url)
    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    rows = {  # id: (status, doubted, claimed_epoch) as the previous version leaves them
        "claimed": ("claimed", False, 1),
        "doubted": ("claimed", True, 1),
        "retried": ("pending", False, 1),
        "retried_doubt": ("in_doubt", True, 1),
        "fresh": ("pending", False, None),
    }
    try:
        due = datetime.now(UTC) - timedelta(seconds=1)
        for name, (status, doubted, epoch) in rows.items():
            await conn.execute(
                "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, "
                "status, doubted, claimed_epoch, claimed_at, attempts) VALUES ($1, 'mq.x', "
                "'{}', $2, $2, $3, $4, $5, now(), 1)",
                name,
                due,
                status,
                doubted,
                epoch,
            )
        await migrate.upgrade_async(database_url)
        options = "SELECT reloptions FROM pg_class WHERE oid = 'delayed_messages'::regclass"
        assert await conn.fetchval(options) == ["fillfactor=45"]
        kept = {
            r["id"]: (r["status"], r["doubted"], r["claimed_epoch"])
            for r in await conn.fetch(
                "SELECT id, status, doubted, claimed_epoch FROM delayed_messages"
            )
        }
        assert kept == rows | {"retried": ("pending", False, None)} | {
            "retried_doubt": ("in_doubt", True, None)
        }
        states = {name: (await tasks.get(name) or {}).get("status") for name in rows}
        assert states == {
            "claimed": "claimed",
            "doubted": "claimed",
            "retried": "pending",
            "retried_doubt": "in_doubt",
            "fresh": "pending",
        }
        cancels = {name: await tasks.cancel(name, "mq.x") for name in ("claimed", "doubted")}
        assert cancels == {"claimed": "too_late", "doubted": "in_flight"}
        assert await tasks.pending_count() == 3
        assert await tasks.pending_by_org() == {None: 5}

        assert await take_office(pool, "previous version") == 1  # the rows' claimed_epoch
        epoch = await take_office(pool, "new")
        orphans = await tasks.reclaim_orphans(epoch)
        assert sorted(c.id for c in orphans.ready) == ["claimed", "doubted"]
        assert await tasks.reclaim_orphans(epoch) == type(orphans)([], [])
        now = {
            r["id"]: (r["status"], r["claimed_epoch"])
            for r in await conn.fetch(
                "SELECT id, status, claimed_epoch FROM delayed_messages "
                "WHERE id IN ('claimed', 'doubted')"
            )
        }
        assert now == {"claimed": ("pending", epoch), "doubted": ("in_doubt", epoch)}
        assert (await tasks.get("doubted") or {})["status"] == "claimed"
        assert await tasks.cancel("doubted", "mq.x") == "in_flight"
        fresh = await claim(tasks, epoch, ["fresh"], datetime.now(UTC))
        await tasks.mark_fired(epoch, [Fired(orphans.ready[0], datetime.now(UTC), "S", 1)], "t")
        assert not await conn.fetchval(
            "SELECT count(*) FROM delayed_messages WHERE id = $1", orphans.ready[0].id
        )

        await asyncio.to_thread(migrate.downgrade, database_url, "0012")
        assert await conn.fetchval(options) is None
        back = {
            r["id"]: r["status"]
            for r in await conn.fetch("SELECT id, status FROM delayed_messages")
        }
        assert back == {
            orphans.ready[1].id: "claimed",
            fresh[0].id: "claimed",
            "retried": "pending",
            "retried_doubt": "in_doubt",
        }
        await migrate.upgrade_async(database_url)
    finally:
        await pool.close()
        await conn.close()


async def test_replicas_migrating_at_once_all_succeed(database_url: str) -> None:
    """Three replicas starting together on an empty database: one migrates, the others wait on
    the advisory lock and then find the schema at head (without it, they race on CREATE TABLE)."""
    await asyncio.to_thread(migrate.downgrade, database_url, "base")
    env = {**os.environ, "SCHEDULER_DATABASE_URL": database_url}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scheduler", "migrate", env=env, stderr=asyncio.subprocess.PIPE
        )
        for _ in range(3)
    ]
    async with asyncio.timeout(60):
        results = [(await p.wait(), (await p.stderr.read()).decode()) for p in procs if p.stderr]
    assert [code for code, _ in results] == [0, 0, 0], [err[-500:] for _, err in results]
    assert await tables(database_url) >= TABLES


async def test_head_read_as_text_matches_alembic_and_skips_an_up_to_date_database(
    database_url: str,
) -> None:
    """The daemon skips Alembic when the database is at the head the scripts name; the text
    reading of that head agrees with Alembic's own."""
    script = ScriptDirectory.from_config(migrate.alembic_config(database_url))
    assert migrate.head_revision() == script.get_current_head()
    assert await migrate.current_revision(database_url) == script.get_current_head()
    await asyncio.to_thread(migrate.downgrade, database_url, "0002")
    assert await migrate.current_revision(database_url) == "0002"
    await migrate.upgrade_async(database_url)  # not at head: Alembic runs
    assert await migrate.current_revision(database_url) == script.get_current_head()


async def test_replicas_migrating_an_empty_database_at_once_all_succeed(database_url: str) -> None:
    """Three replicas migrating an empty database at the same moment all succeed: one migrates
    and commits before it lets the others in, which then find the schema at head."""
    await asyncio.to_thread(migrate.downgrade, database_url, "base")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("DROP TABLE alembic_version")
        # Hold the migration lock until all three wait on it, so they truly start together.
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        env = {**os.environ, "SCHEDULER_DATABASE_URL": database_url}
        procs = [  # processes, as replicas are (Alembic's module context is not for threads)
            await asyncio.create_subprocess_exec(
                sys.executable, "-m", "scheduler", "migrate", env=env, stderr=PIPE
            )
            for _ in range(3)
        ]
        async with asyncio.timeout(60):
            while await conn.fetchval(WAITING_ON_LOCK, MIGRATION_LOCK) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
            results = [(await p.wait(), await p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    finally:
        await conn.close()
    assert [code for code, _ in results] == [0, 0, 0], [err[-500:] for _, err in results]
    head = ScriptDirectory.from_config(migrate.alembic_config(database_url)).get_current_head()
    assert await migrate.current_revision(database_url) == head
    assert await tables(database_url) >= TABLES


MIGRATION_LOCK = 0x6D717363  # migrations/env.py
WAITING_ON_LOCK = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
    "AND objid = ($1::bigint & 4294967295)"
)


async def test_migration_0025_intake_skips_stored_ids_by_key_even_planned_on_an_empty_table(
    database_url: str,
) -> None:
    """The intake function's insert, planned generically on an empty table as its first call
    on a fresh database plans it, reads the ids it skips by the primary key (a subplan per row),
    not with an anti-join over a sequential scan of the whole table, which 0021's statement
    became there and kept as the table grew. Explained from each migration's own text."""
    versions = Path(migrate.migrations_dir()) / "versions"

    def statement(name: str) -> str:
        text = str(runpy.run_path(str(versions / name))["FUNCTION"])
        body = text.split("WITH ins AS (", 1)[1].split("    )\n    SELECT array_agg", 1)[0]
        arrays = "new_ids new_targets new_payloads new_headers new_priorities new_due_us "
        arrays += "new_sched_us new_exp_us new_org_ids new_partitions"
        for n, name_ in enumerate(arrays.split(), 1):
            body = re.sub(rf"\b{name_}\b", f"${n}", body)
        return body

    types = "text[], text[], bytea[], jsonb[], smallint[], bigint[], bigint[], bigint[], "
    types += "text[], smallint[]"
    args = "array['a'], array['t'], array['\\x00'::bytea], array['{}'::jsonb], "
    args += "array[5::smallint], array[1::bigint], array[1::bigint], array[null::bigint], "
    args += "array[null::text], null"
    conn = await asyncpg.connect(database_url)
    plans = {}
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        for name in ("0022_partitions.py", "0025_intake_skip_by_key.py"):
            await conn.execute(f"PREPARE ins({types}) AS {statement(name)}")
            plans[name] = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE ins({args})"))
            await conn.execute("DEALLOCATE ins")
    finally:
        await conn.close()
    assert "Seq Scan on delayed_messages" in plans["0022_partitions.py"]  # what 0025 replaces
    after = plans["0025_intake_skip_by_key.py"]
    assert "Seq Scan on delayed_messages" not in after, after
    assert "Anti Join" not in after and "SubPlan" in after, after
    assert "Index Scan using delayed_messages_pkey" in after, after


async def test_migration_0029_intake_finds_tombstones_by_key_after_planning_on_a_small_table(
    database_url: str,
) -> None:
    """The intake function's tombstone lookup (a task stored again after it fired) reads
    `fired_tasks` by its primary key once the table has grown, even on a connection that ran
    the function while the table was analyzed small (a fresh deployment's first minute):
    0025's statement kept the plan it made then, a sequential scan of every tombstone with
    the batch's ids as a filter, in every later batch. Counted by PostgreSQL's own scan
    statistics of the transaction, for 0025's function and for this one's."""
    versions = Path(migrate.migrations_dir()) / "versions"
    found = runpy.run_path(str(versions / "0029_intake_tombstones_by_key.py"))
    old = str(found["_0025"]).replace("scheduler_intake_insert(", "intake_0025(", 1)
    call = (
        "SELECT count(*) FROM {fn}(array[$1], array['t'], array['\\x00'::bytea], "
        "array['{{}}'::jsonb], array[5::smallint], array[1::bigint], array[1::bigint], "
        "array[null::bigint], array[null::text], null)"
    )
    conn = await asyncpg.connect(database_url)
    scans = {}
    try:
        await conn.execute(old)
        await conn.execute(
            "INSERT INTO fired_tasks SELECT 'tomb-' || g, 't', md5('')::uuid, now() "
            "FROM generate_series(1, 20) AS g"
        )
        await conn.execute("ANALYZE fired_tasks")  # small: one page
        for fn in ("intake_0025", "scheduler_intake_insert"):
            for n in range(8):  # past the 5 custom plans a cached statement makes first
                await conn.fetchval(call.format(fn=fn), f"{fn}-early-{n}")
        await conn.execute(
            "INSERT INTO fired_tasks SELECT 'tomb-' || g, 't', md5('')::uuid, now() "
            "FROM generate_series(21, 20000) AS g"
        )  # grown, not analyzed again
        counts = (
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = "
            "'fired_tasks'"
        )  # this backend's counts not yet reported (earlier transactions' too): a difference
        for fn in ("intake_0025", "scheduler_intake_insert"):
            async with conn.transaction():
                first = await conn.fetchrow(counts)
                for n in range(4):
                    await conn.fetchval(call.format(fn=fn), f"{fn}-late-{n}")
                last = await conn.fetchrow(counts)
                assert first is not None and last is not None
                scans[fn] = (last[0] - first[0], last[1] - first[1])
    finally:
        await conn.close()
    assert scans["intake_0025"][0] == 4, scans  # what 0029 replaces: a whole scan a batch
    assert scans["scheduler_intake_insert"] == (0, 4), scans
