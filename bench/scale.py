"""Scale: N pending tasks (default 1,000,000; also 3,000,000) due over the next day.

Rows are copied straight into PostgreSQL, then the daemon starts. Measured: time from process
start to the first delivery (one task already due), and the daemon's RSS over 20 s. Memory must
follow the horizon, not the pending count. Targets (issue 3): RSS <= 300 MB, first fire < 2 s,
RSS at 3M not meaningfully above RSS at 1M.

    .venv/bin/python bench/scale.py [--counts 1000000,3000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import nats
from common import Daemon, envelope, read_back, report, run, servers

from scheduler import migrate


async def fill(dsn: str, count: int) -> None:
    await migrate.upgrade_async(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        now = datetime.now(UTC)
        _, payload = envelope(now + timedelta(hours=12))
        chunk = 200_000
        for start in range(0, count, chunk):
            rows = []
            for i in range(start, min(start + chunk, count)):
                due = now + timedelta(seconds=1 + random.random() * 86_400)
                rows.append((f"s{i}", "mq.bench.x", payload, "{}", 5, due, due))
            await conn.copy_records_to_table(
                "delayed_messages",
                records=rows,
                columns=[
                    "id",
                    "target",
                    "payload",
                    "headers",
                    "priority",
                    "due_at",
                    "scheduled_for",
                ],
            )
        first = json.loads(envelope(now)[1])
        await conn.execute(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
            "VALUES ($1, 'mq.bench.x', $2, now(), now())",
            first["id"],
            json.dumps(first).encode(),
        )
        await conn.execute("ANALYZE delayed_messages")
    finally:
        await conn.close()


async def measure(count: int) -> dict:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        await nc.jetstream().add_stream(name="BENCH", subjects=["mq.bench.>"], duplicate_window=120)
        started = time.time()
        await fill(env.database_url, count)
        fill_s = time.time() - started
        daemon = Daemon(env)
        t0 = datetime.now(UTC)
        daemon.start(wait_ready=False)
        rss: list[float] = []
        first = None
        try:
            for _ in range(40):
                await asyncio.sleep(0.5)
                if daemon.proc and daemon.proc.poll() is None:
                    rss.append(daemon.rss_mb())
                if first is None:
                    msgs = await read_back(env.nats_url, "BENCH")
                    if msgs:
                        first = min(m.metadata.timestamp for m in msgs)
            heap = daemon.metric("mq_scheduler_heap_size")
        finally:
            daemon.stop()
            await nc.close()
    return {
        "pending": count,
        "fill_seconds": round(fill_s, 1),
        "first_fire_seconds": None if first is None else round((first - t0).total_seconds(), 3),
        "rss_max_mb": round(max(rss)),
        "rss_last_mb": round(rss[-1]),
        "heap_size": heap,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", default="1000000,3000000")
    a = ap.parse_args()
    results = [run(measure(int(c))) for c in a.counts.split(",")]
    rss = [r["rss_max_mb"] for r in results]
    flat = rss[-1] <= rss[0] * 1.15 + 10
    passed = (
        all(r["rss_max_mb"] <= 300 and (r["first_fire_seconds"] or 99) < 2 for r in results)
        and flat
    )
    report(
        "scale",
        vars(a),
        {"runs": results, "rss_flat": flat},
        {"rss_mb_max": 300, "first_fire_seconds_max": 2, "rss_grows_with_pending": False},
        passed,
        "; ".join(
            f"{r['pending']:,} pending: RSS {r['rss_max_mb']} MB, first fire "
            f"{r['first_fire_seconds']} s, heap {r['heap_size']:.0f}"
            for r in results
        ),
    )


if __name__ == "__main__":
    main()
