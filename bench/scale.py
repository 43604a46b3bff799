"""Scale: N pending tasks (default 1,000,000; 3,000,000 too with --with-3m) due over the next day.

Rows are copied straight into PostgreSQL `delayed_messages` (after `scheduler.migrate`), due
between 2 min and 1 day ahead, plus one probe task due 0.5 s after the daemon's process starts.
Measured: time from process start to the probe's arrival at a JetStream consumer, and the
daemon's RSS sampled every 0.25 s for 20 s. Memory must follow the horizon, not the pending count.
Targets (issue 3): RSS <= 300 MB, first fire < 2 s, RSS at 3M not meaningfully above (<= 15 %
+ 10 MB) RSS at 1M.

    .venv/bin/python bench/scale.py [--counts 1000000] [--with-3m] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg
import nats
from common import Daemon, add_target_stream, report, run, servers
from traffic import Collector, envelope

from scheduler import migrate

COLUMNS = [
    "id",
    "target",
    "payload",
    "headers",
    "priority",
    "due_at",
    "scheduled_for",
    "expires_at",
    "status",
]


def row(task_id: str, due: float, now: float) -> tuple[Any, ...]:
    at = datetime.fromtimestamp(due, UTC)
    return (task_id, "mq.bench.x", envelope(task_id, due, now), "{}", 5, at, at, None, "pending")


async def fill(dsn: str, count: int, chunk: int = 200_000) -> None:
    """`count` pending rows due between 2 min and a day from now, by COPY in chunks."""
    await migrate.upgrade_async(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        now = time.time()
        for start in range(0, count, chunk):
            rows = [
                row(f"s{i}", now + 120 + random.random() * 86_400, now)
                for i in range(start, min(start + chunk, count))
            ]
            await conn.copy_records_to_table("delayed_messages", records=rows, columns=COLUMNS)
        await conn.execute("ANALYZE delayed_messages")
    finally:
        await conn.close()


async def measure(count: int, seconds: float) -> dict[str, Any]:
    with servers() as env:
        t0 = time.time()
        await fill(env.database_url, count)
        fill_s = time.time() - t0
        nc = await nats.connect(env.nats_url)
        daemon = Daemon(env)
        try:
            js = nc.jetstream()
            await add_target_stream(js)
            collector = await Collector(js, "BENCH", "mq.bench.>").start()
            conn = await asyncpg.connect(env.database_url)
            try:  # the probe, due 0.5 s after the process starts (spawned right below)
                await conn.copy_records_to_table(
                    "delayed_messages", records=[row("probe", time.time() + 0.5, time.time())],
                    columns=COLUMNS,
                )  # fmt: skip
            finally:
                await conn.close()
            daemon.start(wait_ready=False)
            rss: list[float] = []
            for k in range(1, int(seconds * 4) + 1):
                await asyncio.sleep(max(0.0, daemon.started_at + k / 4 - time.time()))
                if daemon.proc is not None and daemon.proc.poll() is None:
                    rss.append(daemon.rss_mb())
            got = await collector.wait_for(1, 0.1)
            heap = daemon.metric("mq_scheduler_heap_size") if daemon.ready() else float("nan")
            await collector.stop()
        finally:
            daemon.stop()
            await nc.close()
    first = collector.first_arrival - daemon.started_at if got else None
    return {
        "pending": count,
        "fill_seconds": round(fill_s, 1),
        "first_fire_seconds": None if first is None else round(first, 3),
        "probe_lateness_ms": collector.summary(1)["lateness_ms"].get("max"),
        "deliveries_in_window": collector.count,
        "rss_max_mb": round(max(rss, default=0)),
        "rss_last_mb": round(rss[-1] if rss else 0),
        "heap_size": heap,
        "daemon_alive": bool(rss) and len(rss) == int(seconds * 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", default="1000000", help="comma-separated pending counts")
    ap.add_argument("--with-3m", action="store_true", help="also run 3,000,000")
    ap.add_argument("--seconds", type=float, default=20, help="RSS sampling window")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    counts = [int(c) for c in a.counts.split(",")] + ([3_000_000] if a.with_3m else [])
    runs = [run(measure(c, a.seconds)) for c in counts]
    rss = [r["rss_max_mb"] for r in runs]
    flat = rss[-1] <= rss[0] * 1.15 + 10
    passed = flat and all(
        r["rss_max_mb"] <= 300
        and r["first_fire_seconds"] is not None
        and r["first_fire_seconds"] < 2
        and r["daemon_alive"]
        for r in runs
    )
    report(
        "scale",
        {k: v for k, v in vars(a).items() if k != "out"},
        {"runs": runs, "rss_flat": flat},
        {"rss_mb_max": 300, "first_fire_seconds_max": 2, "rss_growth": "<= 15 % + 10 MB"},
        passed,
        "; ".join(
            f"{r['pending']:,} pending: RSS max {r['rss_max_mb']} MB, first fire "
            f"{r['first_fire_seconds']} s, heap {r['heap_size']:.0f}"
            for r in runs
        ),
        a.out,
    )


if __name__ == "__main__":
    main()
