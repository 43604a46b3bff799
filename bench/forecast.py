"""Cost of the forecast query (`mq_scheduler_due_tasks`) against the scan it avoids.

PostgreSQL 16 in a temp dir, the schema migrated, `--pending` tasks due 2 hours to weeks ahead,
then for each size in `--within` that many tasks due within the next hour (50 subjects). For
each size: the forecast query as the leader runs it (one range read of the pending index, top
subjects counted per window) and, in the same run, the baseline a naive refresher would use:
the same per-subject window counts over every pending task (no due bound: a scan). Medians of
`--reps` runs each, the ratio, the share of one PostgreSQL core the refresher takes at its
cadence (every SCHEDULER_FORECAST_INTERVAL, or ten times the query's time when that is longer),
and the CPU seconds of PostgreSQL, the bench and the whole machine over the measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

import asyncpg
from common import cpu_by_command, machine_busy_seconds, own_cpu_seconds, report, run, servers

from scheduler.daemon import migrate
from scheduler.operations.shared import SLOW_FACTOR
from scheduler.store.postgres.overview import FORECAST_SQL, WINDOWS

INTERVAL = 5.0  # SCHEDULER_FORECAST_INTERVAL default
SCAN_SQL = FORECAST_SQL.replace(
    f"AND due_at <= $1::timestamptz + ${len(WINDOWS) + 1}::interval ", ""
)


async def timed(conn: asyncpg.Connection, sql: str, reps: int) -> float:
    spans = [span for _, span in WINDOWS]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        await conn.fetch(sql, datetime.now(UTC), *spans)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def fill(conn: asyncpg.Connection, later: int, within: int) -> None:
    await conn.execute("TRUNCATE delayed_messages")
    insert = (
        "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
        "SELECT $2 || i, 'mq.bench.s' || (i % 50), '{}'::bytea, now() + {due}, now() "
        "FROM generate_series(1, $1) AS i"
    )
    await conn.execute(
        insert.replace("{due}", "interval '2 hours' + i * interval '1 second'"), later, "l"
    )
    await conn.execute(insert.replace("{due}", "(i % 3600) * interval '1 second'"), within, "h")
    await conn.execute("VACUUM ANALYZE delayed_messages")


async def main(args: argparse.Namespace) -> None:
    sizes = [int(x) for x in args.within.split(",")]
    results: dict[str, dict[str, float]] = {}
    with servers() as env:
        await migrate.upgrade_async(env.database_url)
        conn = await asyncpg.connect(env.database_url)
        try:
            pg0, me0, busy0, t0 = (
                cpu_by_command()["postgres"],
                own_cpu_seconds(),
                machine_busy_seconds(),
                time.time(),
            )
            for within in sizes:
                await fill(conn, args.pending, within)
                forecast = await timed(conn, FORECAST_SQL, args.reps)
                scan = await timed(conn, SCAN_SQL, args.reps)
                cadence = max(INTERVAL, SLOW_FACTOR * forecast / 1000)
                results[str(within)] = {
                    "forecast_ms": round(forecast, 1),
                    "scan_ms": round(scan, 1),
                    "scan_over_forecast": round(scan / forecast, 1),
                    "refresher_core_share": round(forecast / 1000 / cadence, 4),
                }
            wall = time.time() - t0
            cpu = {
                "postgres": round(cpu_by_command()["postgres"] - pg0, 2),
                "bench": round(own_cpu_seconds() - me0, 2),
                "machine_busy_fraction": round((machine_busy_seconds() - busy0) / wall / 2, 3),
                "wall_seconds": round(wall, 1),
            }
        finally:
            await conn.close()
    smallest = results[str(sizes[0])]
    passed = smallest["scan_over_forecast"] >= 5 and all(
        r["refresher_core_share"] <= 0.1 for r in results.values()
    )
    summary = ", ".join(
        f"{w} due in 1h: {r['forecast_ms']} ms vs scan {r['scan_ms']} ms "
        f"({r['scan_over_forecast']}x), {r['refresher_core_share']:.1%} of a core"
        for w, r in results.items()
    )
    report(
        "forecast",
        {"pending_beyond_1h": args.pending, "within_1h": sizes, "reps": args.reps},
        {"sizes": results, "cpu": cpu},
        {"scan_over_forecast_at_smallest": ">= 5", "refresher_core_share": "<= 0.1"},
        passed,
        summary,
        args.out,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pending", type=int, default=1_000_000, help="tasks due after 1h")
    parser.add_argument("--within", default="10000,100000,500000", help="tasks due within 1h")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", help="also write the JSON here")
    run(main(parser.parse_args()))
