"""How fast `scheduler partitions set` moves rows: a fresh PostgreSQL holding `--tasks` pending
tasks (stored by the task store, as intake stores them, at P = 1), then the moves 1 -> 8,
8 -> 64 and 64 -> 1 as the command runs them (scheduler/store/postgres/repartition.py, one
transaction each), a dry run before each. For each: rows moved, seconds, rows moved per second
and rows of the table per second (the statement reads every row, moved or not).

    .venv/bin/python bench/repartition.py [--tasks 200000] [--moves 1:8,8:64,64:1] [--out F]

No NATS and no daemon: the liveness check is skipped (`--force`), as on a cluster known to be
down. docs/leadership.md ("Changing the count") quotes its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from common import emit

from scheduler.daemon import migrate
from scheduler.daemon.embedded import Postgres
from scheduler.metrics import Metrics
from scheduler.records import NewTask
from scheduler.store.postgres.connect import PostgresStore, connect, create_pool
from scheduler.store.postgres.partitioning import check_partitions
from scheduler.store.postgres.repartition import repartition
from scheduler.store.postgres.tasks import TaskStore


async def seed(dsn: str, tasks: int, batch: int) -> float:
    """`tasks` pending tasks stored in batches at P = 1; the seconds it took."""
    pool = await create_pool(dsn, min_size=1, max_size=2)
    started = time.perf_counter()
    try:
        await check_partitions(pool, 1)
        store = TaskStore(PostgresStore(pool, Metrics()), partitions=1)
        due = datetime.now(UTC) + timedelta(days=1)
        for start in range(0, tasks, batch):
            stop = min(tasks, start + batch)
            inserted = await store.insert_batch(
                [
                    NewTask(f"01JF{n:022d}", "mq.tasks.bench", b"{}", {}, 5, due, due, None)
                    for n in range(start, stop)
                ]
            )
            assert not inserted.refused, inserted.refused
        await pool.execute("VACUUM ANALYZE delayed_messages")
    finally:
        await pool.close()
    return time.perf_counter() - started


async def moves(dsn: str, pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
    conn = await connect(dsn)
    out = []
    try:
        for was, count in pairs:
            recorded = await conn.fetchval("SELECT partitions FROM partitioning")
            assert recorded == was, (recorded, was)
            started = time.perf_counter()
            dry = await repartition(conn, count, None, dry_run=True)
            dry_seconds = time.perf_counter() - started
            assert dry.moved > 0 and not dry.written
            started = time.perf_counter()
            done = await repartition(conn, count, None)
            seconds = time.perf_counter() - started
            rows = done.tables[0].rows
            assert done.moved == dry.moved, (done.moved, dry.moved)
            out.append(
                {
                    "move": f"{was}->{count}",
                    "rows": rows,
                    "moved": done.moved,
                    "seconds": round(seconds, 2),
                    "moved_per_s": round(done.moved / seconds),
                    "rows_per_s": round(rows / seconds),
                    "dry_run_seconds": round(dry_seconds, 2),
                    "dry_run_rows_per_s": round(rows / dry_seconds),
                }
            )
            await conn.execute("VACUUM ANALYZE delayed_messages")  # as advised after a move
    finally:
        await conn.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--moves", default="1:8,8:64,64:1")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    pairs = [(int(a), int(b)) for a, b in (m.split(":") for m in args.moves.split(","))]
    workdir = tempfile.mkdtemp(prefix="mqs-repartition-")
    pg = Postgres(os.path.join(workdir, "pg")).start()
    try:
        migrate.upgrade(pg.url)
        seeded = asyncio.run(seed(pg.url, args.tasks, args.batch))
        results = asyncio.run(moves(pg.url, pairs))
    finally:
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    doc = {
        "bench": "repartition",
        "params": {"tasks": args.tasks, "moves": args.moves},
        "seed_seconds": round(seeded, 1),
        "results": results,
    }
    summary = "; ".join(
        f"{r['move']} {r['moved']:,} of {r['rows']:,} in {r['seconds']} s "
        f"({r['moved_per_s']:,} moved/s)"
        for r in results
    )
    emit(doc, f"repartition: {summary}", args.out)


if __name__ == "__main__":
    main()
