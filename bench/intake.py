"""Intake: how fast the delay lane is committed to PostgreSQL.

(a) backlog: N tasks (default 600,000, due in an hour) already in MQ_DELAY before the daemon
    starts; rate = N / time from ready to the consumer having nothing pending or unacked.
    Target >= 20,000/s.
(b) live: producers at 10,000/s for D s while 5,000/s fall due (half the tasks due 2 s after
    publishing); intake lag (pending + unacked) sampled every second must not grow.

    .venv/bin/python bench/intake.py [--backlog 600000] [--live-seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

import nats
from burst import wait_drained
from common import Daemon, envelope, paced_publish, report, run, servers
from nats.js.api import RetentionPolicy, StorageType, StreamConfig


async def backlog(count: int) -> dict:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name="MQ_DELAY",
                subjects=["mq.delay.>"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=120,
            )
        )
        due = datetime.now(UTC) + timedelta(hours=1)
        for i in range(count):
            task_id, body = envelope(due)
            await nc.publish("mq.delay.bench.x", body, headers={"Nats-Msg-Id": task_id})
            if i % 20_000 == 0:
                await nc.flush()
        await nc.flush()
        stored = (await js.stream_info("MQ_DELAY")).state.messages
        daemon = Daemon(env).start()
        try:
            seconds = await wait_drained(js, "MQ_DELAY", "scheduler-intake", 600)
            rss = daemon.rss_mb()
        finally:
            daemon.stop()
            await nc.close()
    return {
        "count": count,
        "stored": stored,
        "seconds": round(seconds, 2),
        "rate": round(stored / seconds),
        "daemon_rss_mb": round(rss),
    }


async def live(seconds: float) -> dict:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        js = nc.jetstream()
        await js.add_stream(name="BENCH", subjects=["mq.bench.>"], duplicate_window=120)
        daemon = Daemon(env).start()
        samples: list[int] = []

        async def sample() -> None:
            while True:
                await asyncio.sleep(1)
                info = await js.consumer_info("MQ_DELAY", "scheduler-intake")
                samples.append(info.num_pending + info.num_ack_pending)

        start, rate = time.time() + 0.5, 10_000
        items = []
        for i in range(int(rate * seconds)):
            at = start + i / rate
            later = timedelta(seconds=2) if i % 2 == 0 else timedelta(hours=1)
            task_id, body = envelope(datetime.fromtimestamp(at, UTC) + later)
            items.append((at, "mq.delay.bench.x", body, {"Nats-Msg-Id": task_id}))
        sampler = asyncio.create_task(sample())
        try:
            await paced_publish(nc, items)
        finally:
            sampler.cancel()
            daemon.stop()
            await nc.close()
    third = max(len(samples) // 3, 1)
    first, last = samples[:third], samples[-third:]
    return {
        "seconds": seconds,
        "rate": rate,
        "lag_samples": samples,
        "lag_first_third_avg": round(sum(first) / len(first)),
        "lag_last_third_avg": round(sum(last) / len(last)),
        "lag_max": max(samples),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backlog", type=int, default=600_000)
    ap.add_argument("--live-seconds", type=float, default=30)
    a = ap.parse_args()
    b = run(backlog(a.backlog))
    lv = run(live(a.live_seconds))
    keeps_up = lv["lag_last_third_avg"] <= max(2 * lv["lag_first_third_avg"], 1000) and (
        lv["lag_last_third_avg"] < lv["rate"]
    )
    passed = b["rate"] >= 20_000 and keeps_up
    report(
        "intake",
        vars(a),
        {"backlog": b, "live": lv, "live_keeps_up": keeps_up},
        {"backlog_rate_min": 20_000, "live_lag": "last third <= 2x first third, < 1 s"},
        passed,
        f"backlog {b['stored']} committed at {b['rate']}/s; live 10k/s lag "
        f"{lv['lag_first_third_avg']} -> {lv['lag_last_third_avg']} (max {lv['lag_max']})",
    )


if __name__ == "__main__":
    main()
