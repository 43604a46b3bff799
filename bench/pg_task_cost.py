"""PostgreSQL CPU per delayed task, through the task store alone (no daemon, no NATS).

A fresh PostgreSQL runs the statements one delayed task costs, in batches as the daemon sends
them: intake (`insert_batch`), claim (`claim_within`), booking (`mark_fired`), then the
cleanup they leave behind (the retention purge with retention 0, and a VACUUM of the tables
touched), so dead tuples are paid for whichever design leaves them; the tables' size on disk
once every task fired is reported too, and the share of `delayed_messages` updates (the claims)
PostgreSQL made heap-only (HOT: no index entry, migration 0013). CPU is read from that
server's own processes only (the postmaster's children alive, plus those it reaped), so other
PostgreSQL servers on the host do not count, unlike `cpu_by_command` in common.py.

Then, for the tombstone choice (docs/decisions/2026-11-25-fired-tasks-leave-a-tombstone.md),
the intake-side probe of both candidates
over `--history` fired ids spread over 14 days: `fired_tasks` by primary key, and `fire_log`
(one index probe per daily partition).

    .venv/bin/python bench/pg_task_cost.py [--tasks 200000] [--batch 1000] [--history 1500000]

Run it from another checkout with PYTHONPATH pointing there to measure that code the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from common import emit

from scheduler.daemon import migrate
from scheduler.daemon.embedded import Postgres
from scheduler.metrics import Metrics
from scheduler.records import Fired, NewTask
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.epoch import take_office
from scheduler.store.postgres.tasks import TaskStore

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the postmaster, its reaped children, and its live children."""
    fields = _stat(postmaster)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(int(entry))
        except OSError:
            continue
        if int(fields[1]) == postmaster:  # ppid
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def postmaster_pid(data_dir: str) -> int:
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        return int(f.readline())


def tasks_of(n: int, due: datetime) -> list[NewTask]:
    payload = b'{"schema":"hanzo.mq.v1","type":"bench","data":{"n":' + b"1" * 200 + b"}}"
    return [
        NewTask(uuid.uuid4().hex, "mq.bench.x", payload, {}, 5, due, due, None, org_id=None)
        for _ in range(n)
    ]


async def hot_updates(pool: asyncpg.Pool) -> dict[str, float]:
    """Updates of `delayed_messages` so far and the percentage of them that were HOT, after
    every pooled backend flushed its statistics (PostgreSQL 15+)."""
    conns = [await pool.acquire() for _ in range(pool.get_size())]
    try:
        for conn in conns:  # the flush happens before the statement's reply
            await conn.execute("SELECT pg_stat_force_next_flush()")
        row = await conns[0].fetchrow(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname = 'delayed_messages'"
        )
    finally:
        for conn in conns:
            await pool.release(conn)
    updates = int(row["n_tup_upd"])
    hot = round(100 * int(row["n_tup_hot_upd"]) / updates, 1) if updates else 0.0
    return {"updates": updates, "hot_pct": hot}


async def lifecycle(
    dsn: str, pm: int, total: int, batch: int
) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, float]]:
    """PostgreSQL CPU per task by step, the tables' size on disk once every task fired
    (before the purge and VACUUM), the claims' HOT share, and the WAL written per task (to
    firing, and with the cleanup): a single primary's write-ahead log is where the capacity
    model in bench/README.md looks for PostgreSQL's limit beside its CPU."""
    pool = await create_pool(dsn, min_size=2, max_size=2)
    lsn = "SELECT pg_current_wal_lsn()::text"
    wal_start = await pool.fetchval(lsn)
    store = TaskStore(PostgresStore(pool, Metrics()))
    epoch = await take_office(pool, "bench")
    due = datetime.now(UTC) - timedelta(seconds=1)
    split: dict[str, float] = {"intake": 0.0, "claim": 0.0, "fired": 0.0, "cleanup": 0.0}
    start = server_cpu(pm)
    for _ in range(total // batch):
        group = tasks_of(batch, due)
        t0 = server_cpu(pm)
        await store.insert_batch(group)
        t1 = server_cpu(pm)
        claimed = await store.claim_within(epoch, [t.id for t in group], due, 2**62)
        t2 = server_cpu(pm)
        now = datetime.now(UTC)
        fired = [Fired(c, now, "BENCH", i) for i, c in enumerate(claimed.ready)]
        await store.mark_fired(epoch, fired, "bench")
        t3 = server_cpu(pm)
        split["intake"] += t1 - t0
        split["claim"] += t2 - t1
        split["fired"] += t3 - t2
    wal_fired = await pool.fetchval(lsn)
    hot = await hot_updates(pool)
    sizes = await pool.fetch(
        "SELECT relname, pg_total_relation_size(oid) AS bytes FROM pg_class "
        "WHERE relname IN ('delayed_messages', 'fired_tasks')"
    )
    on_disk = {f"{r['relname']}_mb": round(r["bytes"] / 2**20, 1) for r in sizes}
    t0 = server_cpu(pm)
    await store.purge_finished(0)
    tables = await pool.fetch(
        "SELECT relname FROM pg_class WHERE relname IN ('delayed_messages', 'fired_tasks')"
    )
    for r in tables:
        await pool.execute(f"VACUUM {r['relname']}")
    split["cleanup"] = server_cpu(pm) - t0
    split["total"] = server_cpu(pm) - start
    wal_end = await pool.fetchval(lsn)
    diff = "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)"
    wal = {
        "to_fired": round(float(await pool.fetchval(diff, wal_fired, wal_start)) / total, 1),
        "total": round(float(await pool.fetchval(diff, wal_end, wal_start)) / total, 1),
    }
    await pool.close()
    return {k: round(v / total * 1e6, 1) for k, v in split.items()}, on_disk, hot, wal


async def probes(dsn: str, pm: int, history: int, rounds: int = 50) -> dict[str, float]:
    """Server CPU per probed id: 1,000 fresh ids per statement against `history` fired ids."""
    conn = await asyncpg.connect(dsn)
    await conn.execute("SELECT scheduler_fire_log_upkeep(14, 2)")
    for d in range(1, 15):
        day = f"(now() AT TIME ZONE 'UTC')::date - {d}"
        name = await conn.fetchval(f"SELECT 'fire_log_p' || to_char({day}, 'YYYYMMDD')")
        await conn.execute(
            f"CREATE TABLE {name} (LIKE fire_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        await conn.execute(
            f"ALTER TABLE fire_log ATTACH PARTITION {name} FOR VALUES FROM (({day})::timestamp "
            f"AT TIME ZONE 'UTC') TO (({day} + 1)::timestamp AT TIME ZONE 'UTC')"
        )
    spread = "now() - (g % 1209600) * interval '1 second'"
    await conn.execute(
        "INSERT INTO fire_log (kind, key, subject, scheduled_for, fired_at, attempt, epoch, "
        f"instance) SELECT 'delayed', 'old-' || g, 'mq.bench.x', {spread}, {spread}, 1, 1, 'b' "
        "FROM generate_series(1, $1) g",
        history,
    )
    have_tomb = await conn.fetchval("SELECT to_regclass('fired_tasks') IS NOT NULL")
    if have_tomb:
        await conn.execute(
            "INSERT INTO fired_tasks SELECT 'old-' || g, 'mq.bench.x', md5(g::text)::uuid, "
            f"{spread} FROM generate_series(1, $1) g",
            history,
        )
    await conn.execute("VACUUM ANALYZE")
    queries = {"fire_log": "SELECT key FROM fire_log WHERE kind = 'delayed' AND key = ANY($1)"}
    if have_tomb:
        queries["fired_tasks"] = "SELECT id FROM fired_tasks WHERE id = ANY($1)"
    queries["none"] = "SELECT count(*) FROM unnest($1::text[])"
    out = {}
    for name, sql in queries.items():
        t0 = server_cpu(pm)
        for _ in range(rounds):
            await conn.fetch(sql, [uuid.uuid4().hex for _ in range(1000)])
        out[name] = (server_cpu(pm) - t0) / (rounds * 1000) * 1e6
    await conn.close()
    return {k: round(v - out["none"], 2) for k, v in out.items() if k != "none"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--history", type=int, default=1_500_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="mqs-pgcost-")
    pg = Postgres(os.path.join(workdir, "pg")).start()
    try:
        migrate.upgrade(pg.url)
        pm = postmaster_pid(os.path.join(workdir, "pg"))
        started = time.time()
        per_task, on_disk, hot, wal = asyncio.run(lifecycle(pg.url, pm, args.tasks, args.batch))
        probe = asyncio.run(probes(pg.url, pm, args.history)) if args.history else {}
    finally:
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    result: dict[str, Any] = {
        "bench": "pg_task_cost",
        "code": migrate.migrations_dir().parent.as_posix(),
        "tasks": args.tasks,
        "seconds": round(time.time() - started, 1),
        "postgres_cpu_us_per_task": per_task,
        "size_after_firing_mb": on_disk,
        "delayed_messages_updates": hot,
        "wal_bytes_per_task": wal,
        "intake_probe_cpu_us_per_id": probe,
    }
    emit(
        result,
        f"pg_task_cost: postgres {per_task['total']} us/task (intake {per_task['intake']}, "
        f"claim {per_task['claim']}, fired {per_task['fired']}, cleanup {per_task['cleanup']}); "
        f"WAL {wal['total']} bytes/task; on disk after firing {on_disk}; "
        f"HOT updates {hot['hot_pct']} %; "
        f"tombstone probe us/id {probe}",
        args.out,
    )


if __name__ == "__main__":
    main()
